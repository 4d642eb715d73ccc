"""Single corruptions of real pipeline outputs, each judged wrong or allowed, and the verifier's verdict on each.

The verifier (``loadtest.correctness``) says whether a pipeline's output is what the run's policy requires.
This module checks the verifier: it takes the output of a real faulted run, applies one corruption at a time
to a copy of it (a change row dropped, a digest garbled, a commit marker removed, ...), and asks the verifier
for a verdict, on the whole run and a few sensors at a time (``shard_rows``). A corruption that is wrong under
the contract and the policy must FAIL; one the policy allows (under ``once`` a row a higher seq superseded
first may have no change row, ``none`` may call a faulted session ok, degraded or failed) is not verified,
only listed with the rule that allows it. Whether a corruption is wrong is decided here, from the documents
(docs/pipeline-outputs.md, docs/pipeline.md, docs/own-pipeline.md) and the expectation model's rules
(``loadtest.correctness.expect``), never from what the verifier answers.

Each verdict is given in a forked process with a time and memory limit, so a verifier that hangs (a gap up
to ``2**31`` expanded seq by seq) is reported as not having answered, and cannot take the machine's memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import multiprocessing
import os
import random
import resource
import shutil
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import cached_property
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from loadtest.correctness.expect import build_expectation, read_ledger, read_truth
from loadtest.correctness.outputspec import OutputSpec
from loadtest.correctness.policies import SESSION_LEVEL, Policy
from loadtest.correctness.values import read_snapshots
from loadtest.correctness.verify import verify_run
from sotw.wire import canonical_row

DATASETS = ("changes", "sessions", "integrity", "dead_letters")
#: The rows a shard verifies at most: every sensor becomes a shard of its own (``verify_run``'s sharded path).
SHARDED = 1
WHOLE = 10**12
#: A gap this close to ``2**31`` must be judged from its bounds, not expanded seq by seq: its verdict comes
#: within ``HUGE_GAP_DEADLINE_S`` (a small run verifies in a second, on a busy machine in a few).
HUGE_SEQ = 2**31 - 2
HUGE_GAP_DEADLINE_S = 10.0


# ------------------------------------------------------------------------------------------- the output


@dataclass(frozen=True)
class Row:
    """One row of an output dataset: where it is (a file relative to the output root, its index) and its values."""

    dataset: str
    file: str
    index: int
    values: dict[str, Any]

    @property
    def hive(self) -> dict[str, str]:
        """The Hive partition values of its file (``sensor``, ``date``)."""
        return dict(part.split("=", 1) for part in Path(self.file).parts[1:-1] if "=" in part)

    def named(self) -> str:
        """The row as a report names it: its file and index, and the fields that identify it."""
        v = self.values
        keys = {
            "changes": ("session", "seq", "row_id", "op"),
            "sessions": ("session", "status", "closed_by"),
            "integrity": ("session", "violation", "seq", "got_seq", "missing_from", "missing_to"),
            "dead_letters": ("session", "topic", "partition", "offset"),
        }.get(self.dataset, ("session", "row_id"))
        what = " ".join(f"{k}={v.get(k)}" for k in keys if k in v)
        return f"{self.file}[{self.index}] {what}"


def parquet_files(folder: Path) -> list[Path]:
    """The data files of a dataset (Hive folders included), as the verifier sees them: no ``_``/``.`` parts."""
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(folder).parts)
    )


def read_rows(root: Path, dataset: str) -> list[Row]:
    """Every row of one dataset of an output root, file by file."""
    rows = []
    for path in parquet_files(root / dataset):
        table = pq.read_table(path, partitioning=None)
        rel = str(path.relative_to(root))
        rows += [Row(dataset, rel, i, r) for i, r in enumerate(table.to_pylist())]
    return rows


def committed(root: Path) -> dict[int, dict[str, Any]]:
    """``{batch_id: marker}`` of the ``_commits`` markers."""
    folder = root / "_commits"
    return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")} if folder.is_dir() else {}


def copy_output(source: Path, target: Path) -> Path:
    """A copy of an output root to corrupt: its files hard-linked where they can be (every edit replaces a file)."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:  # another file system
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link)
    return target


def rewrite(root: Path, rel: str, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> None:
    """Replace one Parquet file by its rows after ``edit``, same schema and name (a new inode: links stay intact)."""
    path = root / rel
    table = pq.read_table(path, partitioning=None)
    rows = edit([dict(r) for r in table.to_pylist()])
    write_rows(path, rows, table.schema)


def write_rows(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """Write ``rows`` as ``path`` atomically, replacing whatever file (or link) was there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.corrupting")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    os.replace(tmp, path)


def append_row(root: Path, folder: str, batch: int, row: dict[str, Any], like: Row | None) -> str:
    """Add ``row`` to a file of ``batch`` in ``folder`` (one is made, named like ``like``'s, when none is there).

    Returns the file written, relative to the root.
    """
    target = root / folder
    mine = [p for p in parquet_files(target) if p.parent == target and _batch_of(p) == batch]
    if mine:
        rel = str(mine[0].relative_to(root))
        rewrite(root, rel, lambda rows: [*rows, row])
        return rel
    name = Path(like.file).name if like is not None else f"b{batch}-corrupt.parquet"
    if (target / name).exists():
        name = f"b{batch}-corrupt-{name}"
    schema = _schema_for(root, folder.split("/", 1)[0], like)
    write_rows(target / name, [row], schema)
    return str((target / name).relative_to(root))


def _batch_of(path: Path) -> int | None:
    """The batch a file holds, from its name (``b<batch>-...``) or, failing that, its rows."""
    if path.name.startswith("b") and path.name[1:].split("-", 1)[0].isdigit():
        return int(path.name[1:].split("-", 1)[0])
    column = pq.read_table(path, columns=["batch_id"], partitioning=None)["batch_id"].to_pylist()
    return int(column[0]) if column else None


def _schema_for(root: Path, dataset: str, like: Row | None) -> pa.Schema:
    """The schema of a dataset's files: any file's of the output, else built from the pipeline's records."""
    files = parquet_files(root / dataset)
    if files:
        return pq.read_schema(files[0])
    from pipeline.records import ARROW_SCHEMA
    from pipeline.sinks import COLUMNS

    hive = {"sensor", "date"} if dataset != "dead_letters" else {"date"}
    names = [c for c in dict.fromkeys([*COLUMNS[dataset], "batch_id", "processed_ms"]) if c not in hive]
    types = {f.name: f.type for f in ARROW_SCHEMA}
    return pa.schema([pa.field(n, types.get(n, pa.int64())) for n in names])


# ---------------------------------------------------------------------------------------- the run's facts


@dataclass(frozen=True)
class SessionFacts:
    """What the ledger says of one session, as the rules below need it.

    ``arrivals`` are the session's intact copies the broker took, in Kafka order: ``(seq, kind, offset)``.
    """

    session: str
    sensor: str
    topic: str
    arrivals: tuple[tuple[int, str, int], ...]
    end_seq: int | None
    sent_seqs: frozenset[int]
    touches: dict[int, frozenset[int]]

    @cached_property
    def first_arrival(self) -> dict[int, int]:
        """Each seq's position among the arrivals (its first intact copy)."""
        first: dict[int, int] = {}
        for i, (seq, _, _) in enumerate(self.arrivals):
            first.setdefault(seq, i)
        return first

    @property
    def clean(self) -> bool:
        """Every seq came once, in order, and none is missing: nothing a policy could call a fault."""
        seqs = [s for s, _, _ in self.arrivals]
        return self.end_seq is not None and seqs == list(range(self.end_seq + 1))

    def superseded(self, seq: int, row_id: int) -> bool:
        """Whether a higher seq touching ``row_id`` came before ``seq``'s first copy (``once``'s optional change)."""
        at = self.first_arrival.get(seq)
        return at is not None and any(
            t > seq and row_id in rows and self.first_arrival.get(t, math.inf) < at
            for t, rows in self.touches.items()
        )

    def copies_before_end(self, seq: int) -> int:
        """How many intact copies of ``seq`` came before the session's end (``none`` applies each)."""
        end = next((i for i, (s, k, _) in enumerate(self.arrivals) if k == "end"), len(self.arrivals))
        return sum(1 for s, _, _ in self.arrivals[:end] if s == seq)

    def in_order(self, seq: int) -> bool:
        """Whether ``seq`` came once, after every lower seq and before any higher one."""
        seqs = [s for s, _, _ in self.arrivals]
        if seqs.count(seq) != 1:
            return False
        at = seqs.index(seq)
        return set(seqs[:at]) == set(range(seq)) and all(s > seq for s in seqs[at + 1 :])


def session_facts(run_dir: Path) -> dict[str, SessionFacts]:
    """Every session's facts, from the ledger and the rows each snapshot carried."""
    ledger = read_ledger(run_dir)
    snapshots = read_snapshots(run_dir)
    carried: dict[str, frozenset[int]] = defaultdict(frozenset)
    if not snapshots.empty:
        for name, group in snapshots.groupby("session"):
            carried[str(name)] = frozenset(int(i) for i in group["id"])
    facts = {}
    for name, rows in ledger.groupby("session"):
        session = str(name)
        intact = rows[rows["delivered"].fillna(False).astype(bool) & rows["offset"].notna()]
        intact = intact[intact["fault"] != "malformed"].sort_values(["partition", "offset"])
        touches: dict[int, frozenset[int]] = {}
        for r in rows.drop_duplicates("seq").to_dict("records"):
            if r["kind"] == "snapshot":
                touches[int(r["seq"])] = carried[session]
            elif r["kind"] == "update" and r.get("row_id") is not None and not _nan(r.get("row_id")):
                touches[int(r["seq"])] = frozenset({int(r["row_id"])})
        ends = rows.loc[rows["kind"] == "end", "seq"]
        first = rows.iloc[0]
        facts[session] = SessionFacts(
            session=session,
            sensor=str(first["sensor"]),
            topic=str(first["topic"]),
            arrivals=tuple(
                (int(s), str(k), int(o))
                for s, k, o in zip(intact["seq"], intact["kind"], intact["offset"], strict=True)
            ),
            end_seq=int(ends.iloc[0]) if len(ends) else None,
            sent_seqs=frozenset(int(s) for s in rows.loc[rows["sent_ts"].notna(), "seq"]),
            touches=touches,
        )
    return facts


def _nan(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@dataclass
class FullRun:
    """A real run under the full contract: its ledger, the output its pipeline wrote, and how the job ended.

    Parameters
    ----------
    name
        The policy and settings, as the report names them (``window(3)``).
    run_dir
        The simulator's run directory (ledger, truth).
    output
        The pipeline's output root, left untouched: every corruption is made on a copy.
    policy
        The verifier's policy for the run.
    stopped
        Whether the pipeline stopped on its own (``strict`` at its first violation).
    error
        What it said when it stopped.
    """

    name: str
    run_dir: Path
    output: Path
    policy: Policy
    stopped: bool
    error: str = ""

    def check(self, root: Path, shard_rows: int) -> Check:
        """The verification of ``root``, a copy of this run's output, ``shard_rows`` at a time."""
        return Check(
            self.run_dir, root, "full", self.policy, self.stopped, shard_rows, self.error, self.expectation
        )

    @cached_property
    def sessions(self) -> dict[str, SessionFacts]:
        return session_facts(self.run_dir)

    @cached_property
    def rows(self) -> dict[str, list[Row]]:
        """The visible rows of each dataset: those of committed batches."""
        batches = set(self.markers)
        return {
            ds: [r for r in read_rows(self.output, ds) if r.values.get("batch_id") in batches]
            for ds in DATASETS
        }

    @cached_property
    def markers(self) -> dict[int, dict[str, Any]]:
        return committed(self.output)

    @cached_property
    def expectation(self) -> Any:
        """What the expectation model says the pipeline must write (``loadtest.correctness.expect``)."""
        return build_expectation(
            self.policy, read_ledger(self.run_dir), read_truth(self.run_dir), read_snapshots(self.run_dir)
        )

    @property
    def readings(self) -> dict[str, tuple[Any, ...]]:
        """The expectation model's readings of each session."""
        return dict(self.expectation.sessions)

    @property
    def must_stop(self) -> bool:
        return self.policy.name == "strict" and self.stopped

    @cached_property
    def recorded(self) -> set[str]:
        """Sessions with a session record in the untouched output."""
        return {str(r.values["session"]) for r in self.rows["sessions"]}

    def changes_of(self, session: str) -> list[Row]:
        return [r for r in self.rows["changes"] if r.values["session"] == session]

    def required(self, session: str, event: tuple[str, int]) -> bool:
        """Whether every reading of the policy requires the pipeline to report ``event`` for the session."""
        readings = self.readings.get(session, ())
        return bool(readings) and all(event in r.events_required for r in readings)

    def allowed_event(self, session: str, event: tuple[str, int]) -> bool:
        """Whether some reading of the policy allows the pipeline to report ``event`` for the session."""
        return any(event in r.events_allowed for r in self.readings.get(session, ()))


@dataclass
class TablesRun:
    """A team job's final table (the tables contract) over a run, left untouched."""

    name: str
    run_dir: Path
    table: Path

    def check(self, root: Path, shard_rows: int) -> Check:
        """The verification of ``root``, a copy of this run's table (the tables contract is read whole)."""
        return Check(self.run_dir, root, "tables", Policy("ordered"), False, shard_rows)

    @property
    def output(self) -> Path:
        return self.table

    @cached_property
    def sessions(self) -> dict[str, SessionFacts]:
        return session_facts(self.run_dir)

    @cached_property
    def rows(self) -> list[Row]:
        rows = []
        for path in parquet_files(self.table):
            t = pq.read_table(path, partitioning=None)
            rel = str(path.relative_to(self.table))
            rows += [Row("table", rel, i, r) for i, r in enumerate(t.to_pylist())]
        return rows

    @cached_property
    def not_judged(self) -> set[str]:
        """Sessions with a copy sent and neither acknowledged nor refused: docs/own-pipeline.md does not judge them."""
        ledger = read_ledger(self.run_dir)
        unknown = ledger["sent_ts"].notna() & ~ledger["delivered"].fillna(False).astype(bool)
        if "error" in ledger:
            refused = (
                ledger["error"].fillna("").astype(str).str.startswith(("Local: Purged in queue", "Broker:"))
            )
            unknown &= ~refused
        return {str(s) for s in ledger.loc[unknown, "session"]}


# ------------------------------------------------------------------------------------------ corruptions


@dataclass(frozen=True)
class Corruption:
    """One single corruption of an output: its kind, the row it hits, what it changes, and how.

    ``allowed`` names the rule under which the changed output is still right (it is then not verified);
    None when it is wrong and must FAIL. ``expect_pass`` marks a change that is no corruption at all (a
    value written another way), which must PASS.
    """

    kind: str
    run: str
    target: str
    change: str
    apply: Callable[[Path], None] = field(repr=False, compare=False)
    allowed: str | None = None
    expect_pass: bool = False
    #: Seconds within which the verdict must come (a verifier that gets there only slowly has not caught it).
    deadline_s: float | None = None

    def named(self) -> str:
        return f"{self.kind} [{self.run}] {self.target}: {self.change}"


Generator = Callable[[Any, random.Random, int], list[Corruption]]


def _pick(rng: random.Random, items: Sequence[Any], many: int) -> list[Any]:
    """Up to ``many`` of ``items``, spread over them (deterministic for a seeded ``rng``)."""
    items = list(items)
    return items if len(items) <= many else rng.sample(items, many)


def _spread(rng: random.Random, rows: Sequence[Row], many: int, key: Callable[[Row], Any]) -> list[Row]:
    """Up to ``many`` rows, from as many different ``key`` groups (sessions) as there are."""
    groups: dict[Any, list[Row]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    order = list(groups)
    rng.shuffle(order)
    for g in order:
        rng.shuffle(groups[g])
    out: list[Row] = []
    while len(out) < many and any(groups.values()):
        for g in order:
            if groups[g] and len(out) < many:
                out.append(groups[g].pop())
    return out


def _session_key(r: Row) -> Any:
    return r.values.get("session")


def _edit_row(rel: str, index: int, edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        def change(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
            edit(rows[index])
            return rows

        rewrite(root, rel, change)

    return apply


def _drop_row(rel: str, index: int) -> Callable[[Path], None]:
    return lambda root: rewrite(root, rel, lambda rows: rows[:index] + rows[index + 1 :])


def _set(**values: Any) -> Callable[[dict[str, Any]], None]:
    def edit(row: dict[str, Any]) -> None:
        row.update(values)

    return edit


def _stop_records(run: FullRun) -> list[Row]:
    """Under a strict stop, the integrity records that name the violation it stopped at."""
    if not run.must_stop:
        return []
    return [r for r in run.rows["integrity"] if r.values["violation"] != "malformed"]


def _strict_prefix_rule(run: FullRun, row: Row) -> str | None:
    """Under a strict stop, a session without a record may hold a prefix of its messages in Kafka order.

    docs/loadtest.md ("The strict policy's stop") and the expectation model (``cut_short``): once the output
    names the violation the query stopped at, every session may hold only a prefix of its changes. Not a
    session whose record says it closed, nor the stopped session: its violation names the seq it expected,
    so it holds every seq before that one.
    """
    session = row.values["session"]
    if not run.must_stop or session in run.recorded:
        return None
    if any(r.values["session"] == session for r in _stop_records(run)):
        return None
    mine = run.changes_of(str(session))
    last = max(int(r.values["offset"]) for r in mine)
    if len(mine) == 1:
        return "strict stopped the query: a session cut short may be absent (expect.py _relax_for_stop)"
    if int(row.values["offset"]) == last and sum(1 for r in mine if r.values["offset"] == last) == 1:
        return (
            "strict stopped the query: a session without a record may hold only a prefix of its messages "
            "(expect.py cut_short), and without its last message's one change row it still does"
        )
    return None


def drop_change(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    rows = _spread(rng, run.rows["changes"], many, _session_key)
    # One target each rule may allow, when the run has one: the rule is then listed, not just written down.
    for rule in (_strict_prefix_rule, _once_superseded_rule):
        allowed = [r for r in run.rows["changes"] if rule(run, r) is not None]
        if allowed and not any(rule(run, r) for r in rows):
            rows.append(rng.choice(allowed))
    return [
        Corruption(
            "drop a change row",
            run.name,
            row.named(),
            "removed",
            _drop_row(row.file, row.index),
            _strict_prefix_rule(run, row) or _once_superseded_rule(run, row),
        )
        for row in rows
    ]


def _once_superseded_rule(run: FullRun, row: Row) -> str | None:
    v = row.values
    if run.policy.name == "once" and run.sessions[str(v["session"])].superseded(
        int(v["seq"]), int(v["row_id"])
    ):
        return (
            "once: a row superseded by a higher seq that came first may or may not have a change row "
            "(expect.py module docstring)"
        )
    return None


def duplicate_change(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    # A delete a re-applied snapshot writes for a row it lacks has no copy count of its own: not a target.
    candidates = [r for r in run.rows["changes"] if r.values["op"] in ("upsert", "snapshot", "delete")]
    candidates = [r for r in candidates if not (r.values["op"] == "delete" and r.values["seq"] == 0)]
    out = []
    for row in _spread(rng, candidates, many, _session_key):
        v = row.values
        same = sum(
            1
            for r in run.rows["changes"]
            if (r.values["session"], r.values["seq"], r.values["row_id"])
            == (v["session"], v["seq"], v["row_id"])
        )
        allowed = None
        copies = run.sessions[str(v["session"])].copies_before_end(int(v["seq"]))
        if run.policy.name == "none" and same < copies:
            allowed = f"none applies every copy: seq {v['seq']} came {copies} times before the end"

        def apply(root: Path, rel: str = row.file, i: int = row.index) -> None:
            rewrite(root, rel, lambda rows: [*rows[: i + 1], dict(rows[i]), *rows[i + 1 :]])

        out.append(
            Corruption("duplicate a change row", run.name, row.named(), "written twice", apply, allowed)
        )
    return out


def _other_session(run: FullRun, session: str, rng: random.Random, same_sensor: bool = True) -> str | None:
    mine = run.sessions[session]
    others = sorted(
        s for s, f in run.sessions.items() if s != session and (f.sensor == mine.sensor) == same_sensor
    )
    return rng.choice(others) if others else None


def move_change_to_session(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    out = []
    for row in _spread(rng, run.rows["changes"], many, _session_key):
        other = _other_session(run, str(row.values["session"]), rng)
        if other is None:
            continue
        out.append(
            Corruption(
                "move a change row to another session",
                run.name,
                row.named(),
                f"session -> {other}",
                _edit_row(row.file, row.index, _set(session=other)),
            )
        )
    return out


def move_change_to_sensor(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    sensors = sorted({f.sensor for f in run.sessions.values()})
    out = []
    for row in _spread(rng, run.rows["changes"], many, _session_key):
        hive = row.hive
        others = [s for s in sensors if s != hive.get("sensor")]
        if not others:
            continue
        to = rng.choice(others)
        folder = f"changes/sensor={to}/date={hive.get('date')}"

        def apply(root: Path, row: Row = row, folder: str = folder) -> None:
            moved = dict(row.values)
            rewrite(root, row.file, lambda rows: rows[: row.index] + rows[row.index + 1 :])
            append_row(root, folder, int(moved["batch_id"]), moved, row)

        out.append(
            Corruption(
                "move a change row to another sensor",
                run.name,
                row.named(),
                f"moved from sensor={hive.get('sensor')} to {folder}",
                apply,
            )
        )
    return out


def _changed_values(text: str, how: str) -> tuple[str, str]:
    row = json.loads(text)
    if how == "number":
        key = (
            "value"
            if isinstance(row.get("value"), int | float)
            else next(
                k
                for k, v in row.items()
                if k != "id" and isinstance(v, int | float) and not isinstance(v, bool)
            )
        )
        new = {**row, key: float(row[key]) + 1.25}
        what = f"{key} {row[key]} -> {new[key]}"
    elif how == "text":
        key = next(k for k, v in row.items() if isinstance(v, str))
        new = {**row, key: row[key] + "-x"}
        what = f"{key} {row[key]!r} -> {new[key]!r}"
    else:
        new = {**row, "extra": 1}
        what = "column 'extra' added"
    return canonical_row(new), what


def change_value(
    run: FullRun, rng: random.Random, many: int, hows: Sequence[str] = ("number", "text", "column")
) -> list[Corruption]:
    candidates = [r for r in run.rows["changes"] if isinstance(r.values.get("values"), str)]
    out = []
    for n, row in enumerate(_spread(rng, candidates, many, _session_key)):
        how = hows[n % len(hows)]
        text, what = _changed_values(str(row.values["values"]), how)
        out.append(
            Corruption(
                "change a value",
                run.name,
                row.named(),
                what,
                _edit_row(row.file, row.index, _set(values=text)),
            )
        )
    return out


#: (op, new op, whether the values go too): a plausible slip first, then an op no policy knows.
OP_SWAPS = (
    ("upsert", "delete", True),
    ("upsert", "frobnicate", False),
    ("snapshot", "upsert", False),
    ("snapshot", "frobnicate", False),
    ("delete", "upsert", False),
)


def change_op(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    out = []
    # The fast form turns an upsert into a delete and into an op no one knows; the long form every swap.
    for old, new, drop_values in OP_SWAPS if many > 1 else OP_SWAPS[:2]:
        rows = [r for r in run.rows["changes"] if r.values["op"] == old]
        values = {"op": new, **({"values": None} if drop_values else {})}
        for row in _spread(rng, rows, max(1, many // 2), _session_key):
            out.append(
                Corruption(
                    "change an op",
                    run.name,
                    row.named(),
                    f"op {old} -> {new}" + (", values -> null" if drop_values else ""),
                    _edit_row(row.file, row.index, _set(**values)),
                )
            )
    return out


def change_seq(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    out = []
    for n, row in enumerate(_spread(rng, run.rows["changes"], many, _session_key)):
        seq = int(row.values["seq"])
        new = seq + 1 if n % 2 == 0 or seq == 0 else seq - 1
        out.append(
            Corruption(
                "change a seq",
                run.name,
                row.named(),
                f"seq {seq} -> {new}",
                _edit_row(row.file, row.index, _set(seq=new)),
            )
        )
    return out


def add_change_for_unsent_seq(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    out = []
    for row in _spread(
        rng, [r for r in run.rows["changes"] if r.values["op"] == "upsert"], many, _session_key
    ):
        facts = run.sessions[str(row.values["session"])]
        never = sorted(set(facts.touches) - facts.sent_seqs)  # a gap: in the ledger, never sent
        seq = rng.choice(never) if never else max([*facts.touches, facts.end_seq or 0]) + 3
        added = {**row.values, "seq": seq}

        def apply(root: Path, rel: str = row.file, added: dict[str, Any] = added) -> None:
            rewrite(root, rel, lambda rows: [*rows, added])

        why = "a gap, never sent" if never else "past the session's end"
        out.append(
            Corruption(
                "add a change row for a seq never sent",
                run.name,
                row.named(),
                f"a copy of it at seq {seq} ({why})",
                apply,
            )
        )
    return out


def null_change_session(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    return [
        Corruption(
            "null a change row's session",
            run.name,
            row.named(),
            "session -> null",
            _edit_row(row.file, row.index, _set(session=None)),
        )
        for row in _spread(rng, run.rows["changes"], many, _session_key)
    ]


def _none_status_rule(run: FullRun, session: str, new: str) -> str | None:
    if run.policy.name == "none" and not run.sessions[session].clean and new in ("ok", "degraded", "failed"):
        return "none: a session a fault reached may close ok, degraded or failed (expect.py table)"
    return None


def change_status(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    statuses = ("ok", "degraded", "failed", "timed_out")
    out = []
    for row in _spread(rng, run.rows["sessions"], many, _session_key):
        old = str(row.values["status"])
        # One status for the fast form (the neighbour a slip would give), every other one for the long form.
        news = [s for s in statuses if s != old] if many > 1 else ["degraded" if old == "ok" else "ok"]
        for new in news:
            out.append(
                Corruption(
                    "change a session status",
                    run.name,
                    row.named(),
                    f"status {old} -> {new}",
                    _edit_row(row.file, row.index, _set(status=new)),
                    _none_status_rule(run, str(row.values["session"]), new),
                )
            )
    return out


def change_digest(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    out = []
    # Degraded and failed sessions first: their digest is not the truth's, only the change rows say it.
    records = sorted(run.rows["sessions"], key=lambda r: r.values["status"] == "ok")
    for n, row in enumerate(records[:many] if many == 1 else _spread(rng, records, many, _session_key)):
        old = row.values["digest"]
        new = hashlib.sha256(f"corrupted {old}".encode()).hexdigest() if n % 2 == 0 else "not-a-digest"
        out.append(
            Corruption(
                "change a session digest",
                run.name,
                row.named(),
                f"digest {str(old)[:12]}... -> {new[:12]}...",
                _edit_row(row.file, row.index, _set(digest=new)),
            )
        )
    return out


def change_row_count(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    out = []
    for n, row in enumerate(_spread(rng, run.rows["sessions"], many, _session_key)):
        old = int(row.values["row_count"])
        new = old + 1 if n % 2 == 0 else max(0, old - 1)
        out.append(
            Corruption(
                "change a session row_count",
                run.name,
                row.named(),
                f"row_count {old} -> {new}",
                _edit_row(row.file, row.index, _set(row_count=new)),
            )
        )
    return out


def null_closed_by(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    return [
        Corruption(
            "null a session's closed_by",
            run.name,
            row.named(),
            f"closed_by {row.values['closed_by']} -> null",
            _edit_row(row.file, row.index, _set(closed_by=None)),
        )
        for row in _spread(rng, run.rows["sessions"], many, _session_key)
    ]


def _valid_copies(run: FullRun) -> list[tuple[SessionFacts, int, str, int]]:
    """Intact copies the pipeline read in a committed batch: (session, seq, kind, offset)."""
    read = {(r.values["session"], int(r.values["offset"])) for r in run.rows["changes"]}
    return [(f, s, k, o) for f in run.sessions.values() for s, k, o in f.arrivals if (f.session, o) in read]


def add_dead_letter(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    out = []
    date = next((r.hive.get("date") for r in run.rows["changes"]), "1970-01-01")
    batch = min(run.markers)
    like = run.rows["dead_letters"][0] if run.rows["dead_letters"] else None
    for facts, seq, _kind, offset in _pick(rng, _valid_copies(run), many):
        row = {
            "sensor": facts.sensor,
            "session": facts.session,
            "topic": facts.topic,
            "partition": 0,
            "offset": offset,
            "key": facts.session.encode(),
            "value": b"{}",
            "detail": "not JSON",
            "batch_id": batch,
            "processed_ms": run.markers[batch].get("processed_ms", 0),
        }
        row["partition"] = _partition_of(run, facts.session, offset)

        def apply(root: Path, row: dict[str, Any] = row) -> None:
            append_row(root, f"dead_letters/date={date}", int(row["batch_id"]), row, like)

        out.append(
            Corruption(
                "add a dead letter for a valid message",
                run.name,
                f"session {facts.session} seq {seq} at {facts.topic}[{row['partition']}]@{offset}",
                "a dead letter for it",
                apply,
            )
        )
    return out


def _partition_of(run: FullRun, session: str, offset: int) -> int:
    for r in run.rows["changes"]:
        if r.values["session"] == session and int(r.values["offset"]) == offset:
            return int(r.values["partition"])
    return 0


def remove_dead_letter(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    return [
        Corruption("remove a dead letter", run.name, row.named(), "removed", _drop_row(row.file, row.index))
        for row in _spread(rng, run.rows["dead_letters"], many, _session_key)
    ]


def _integrity_rule(run: FullRun, v: dict[str, Any]) -> str | None:
    """The rule that lets this integrity record be absent, or None when it must be there."""
    session, kind = str(v["session"]), str(v["violation"])
    if run.must_stop and kind != "malformed":
        # docs/loadtest.md: the stop is judged by the output naming a violation the policy stops at.
        if len(_stop_records(run)) == 1:
            return None
        return (
            "strict: another record names a violation the query stops at, and the session it no longer names "
            "may hold a prefix of its changes (docs/loadtest.md, the strict policy's stop)"
        )
    if kind in ("malformed", "digest_mismatch"):
        # docs/pipeline.md: a malformed message gets a dead letter *and* a `malformed` record under every
        # policy; an end whose digest differs from the rebuilt table's is a `digest_mismatch`.
        return None
    if kind == "missing_snapshot":
        if 0 not in run.sessions[session].first_arrival:
            return None  # docs/pipeline.md: a session that starts after seq 0 gets a missing_snapshot
        event: list[tuple[str, int]] = [(kind, SESSION_LEVEL)]
    elif kind == "gap" and v.get("missing_from") is not None and v.get("missing_to") is not None:
        event = [(kind, s) for s in range(int(v["missing_from"]), int(v["missing_to"]) + 1)]
    else:
        got = v.get("got_seq")
        event = [(kind, int(got) if got is not None else SESSION_LEVEL)]
    if any(run.required(session, e) for e in event):
        return None
    facts = run.sessions[session]
    end = next((o for _, k, o in facts.arrivals if k == "end"), None)
    if end is not None and v.get("offset") is not None and int(v["offset"]) > end:
        return (
            "a copy that came after its session closed may be reported as late, duplicate or reorder, "
            "or not at all (expect.py Outcome.late)"
        )
    return f"{_why_not_required(run.policy.name, kind)} (expect.py table)"


def _why_not_required(policy: str, kind: str) -> str:
    if policy == "once" and kind == "reorder":
        return "once must report duplicates and the seqs missing at close; a reorder is tolerated, reported or not"
    if policy == "window" and kind == "reorder":
        return "window must report a reorder only when it came after its hole expired"
    if policy == "none":
        return "none reports nothing but malformed messages and timeouts; it only counts the rest"
    return f"{policy} does not require this {kind} to be reported"


#: The violation kinds whose records the fast form removes (one each), in this order of preference.
FAST_INTEGRITY = ("gap", "malformed", "digest_mismatch")


def remove_integrity(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    by_kind: dict[str, list[Row]] = defaultdict(list)
    for r in run.rows["integrity"]:
        by_kind[str(r.values["violation"])].append(r)
    kinds = sorted(by_kind)
    if many == 1:  # one record of a few kinds; the long form removes many of each
        kinds = [k for k in FAST_INTEGRITY if k in by_kind] or kinds[:1]
    return [
        Corruption(
            "remove an integrity record",
            run.name,
            row.named(),
            "removed",
            _drop_row(row.file, row.index),
            _integrity_rule(run, row.values),
        )
        for kind in kinds
        for row in _spread(rng, by_kind[kind], many, _session_key)
    ]


def _integrity_row(run: FullRun, facts: SessionFacts, like: Row, **values: Any) -> dict[str, Any]:
    base = dict.fromkeys(["seq", "expected_seq", "got_seq", "missing_from", "missing_to", "detail"], None)
    return {
        **base,
        "session": facts.session,
        "event_ms": like.values.get("event_ms"),
        "topic": facts.topic,
        "partition": like.values.get("partition"),
        "offset": like.values.get("offset"),
        "batch_id": like.values.get("batch_id"),
        "processed_ms": like.values.get("processed_ms"),
        **values,
    }


def _add_integrity(kind: str, run: FullRun, like: Row, row: dict[str, Any], change: str) -> Corruption:
    hive = like.hive
    folder = f"integrity/sensor={hive.get('sensor')}/date={hive.get('date')}"
    template = run.rows["integrity"][0] if run.rows["integrity"] else like

    def apply(root: Path) -> None:
        append_row(
            root, folder, int(row["batch_id"]), row, template if template.dataset == "integrity" else like
        )

    return Corruption(kind, run.name, like.named(), change, apply)


def _in_order_changes(run: FullRun) -> list[Row]:
    """Change rows of updates that came once and in order, which no policy may call a violation."""
    rows = []
    for r in run.rows["changes"]:
        facts = run.sessions[str(r.values["session"])]
        seq = int(r.values["seq"])
        if (
            r.values["op"] != "snapshot"
            and facts.in_order(seq)
            and not any(run.allowed_event(facts.session, (k, seq)) for k in ("gap", "duplicate", "reorder"))
        ):
            rows.append(r)
    return rows


def add_false_integrity(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    out = []
    kinds = ("gap", "duplicate", "reorder")
    for n, like in enumerate(_spread(rng, _in_order_changes(run), many, _session_key)):
        facts = run.sessions[str(like.values["session"])]
        seq = int(like.values["seq"])
        kind = kinds[n % len(kinds)] if many > 1 else "gap"
        if kind == "gap":
            row = _integrity_row(
                run,
                facts,
                like,
                violation="gap",
                expected_seq=seq,
                got_seq=seq + 1,
                missing_from=seq,
                missing_to=seq,
            )
            change = f"a gap of seq {seq}, which came in order"
        else:
            row = _integrity_row(run, facts, like, violation=kind, seq=seq, expected_seq=seq + 1, got_seq=seq)
            change = f"a {kind} of seq {seq}, which came once and in order"
        out.append(_add_integrity("add a false integrity record", run, like, row, change))
    return out


def add_false_malformed(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    out = []
    for like in _spread(rng, run.rows["changes"], many, _session_key):
        facts = run.sessions[str(like.values["session"])]
        row = _integrity_row(run, facts, like, violation="malformed", detail="not JSON")
        change = f"a malformed record at offset {like.values['offset']}, a valid message"
        out.append(_add_integrity("add a false malformed record", run, like, row, change))
    return out


def add_huge_gap(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    out = []
    for like in _spread(rng, _in_order_changes(run), many, _session_key):
        facts = run.sessions[str(like.values["session"])]
        seq = int(like.values["seq"])
        row = _integrity_row(
            run,
            facts,
            like,
            violation="gap",
            expected_seq=seq,
            got_seq=HUGE_SEQ + 1,
            missing_from=seq,
            missing_to=HUGE_SEQ,
        )
        huge = _add_integrity("add a gap up to 2**31", run, like, row, f"a gap of seq {seq}..{HUGE_SEQ}")
        out.append(replace(huge, deadline_s=HUGE_GAP_DEADLINE_S))
    return out


def remove_marker(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    out = []
    last = max(run.markers)
    for batch in _pick(rng, sorted(run.markers), many):
        rows = sum(int(n) for n in run.markers[batch].get("rows", {}).values())
        allowed = None
        if rows == 0:
            allowed = "the batch wrote no rows: without its marker the visible output is the same"
        elif (
            run.must_stop
            and batch == last
            and not any(r.values["batch_id"] == batch for r in _stop_records(run))
        ):
            allowed = (
                "strict stopped the query, and where its batches end is Spark's, not the ledger's: an output "
                "that ends one batch earlier is a stop the ledger cannot tell apart"
            )

        def apply(root: Path, batch: int = batch) -> None:
            (root / "_commits" / f"{batch}.json").unlink()

        out.append(
            Corruption(
                "remove a commit marker",
                run.name,
                f"_commits/{batch}.json ({rows} rows)",
                "removed",
                apply,
                allowed,
            )
        )
    return out


def change_event_ms(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    return [
        Corruption(
            "change a change row's event_ms",
            run.name,
            row.named(),
            f"event_ms {row.values['event_ms']} -> {int(row.values['event_ms']) + 1000}",
            _edit_row(row.file, row.index, _set(event_ms=int(row.values["event_ms"]) + 1000)),
        )
        for row in _spread(rng, run.rows["changes"], many, _session_key)
    ]


def change_topic(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    topics = sorted({f.topic for f in run.sessions.values()})
    out = []
    for row in _spread(rng, run.rows["changes"], many, _session_key):
        other = next((t for t in topics if t != row.values["topic"]), None)
        if other is not None:
            out.append(
                Corruption(
                    "change a change row's topic",
                    run.name,
                    row.named(),
                    f"topic {row.values['topic']} -> {other}",
                    _edit_row(row.file, row.index, _set(topic=other)),
                )
            )
    return out


def change_expected_digest(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    records = [r for r in run.rows["sessions"] if r.values.get("expected_digest")]
    return [
        Corruption(
            "change a session's expected_digest",
            run.name,
            row.named(),
            "expected_digest -> the digest of something else",
            _edit_row(
                row.file, row.index, _set(expected_digest=hashlib.sha256(b"something else").hexdigest())
            ),
        )
        for row in _spread(rng, records, many, _session_key)
    ]


def change_dead_letter_value(run: FullRun, rng: random.Random, many: int) -> list[Corruption]:
    return [
        Corruption(
            "change a dead letter's bytes",
            run.name,
            row.named(),
            "value -> b'not the copy that came'",
            _edit_row(row.file, row.index, _set(value=b"not the copy that came")),
        )
        for row in _spread(rng, run.rows["dead_letters"], many, _session_key)
    ]


#: The kinds of corruption of the full contract the fast form applies, in the report's order.
FAST_KINDS: tuple[Generator, ...] = (
    drop_change,
    duplicate_change,
    move_change_to_session,
    move_change_to_sensor,
    change_value,
    change_op,
    change_seq,
    null_change_session,
    add_change_for_unsent_seq,
    change_status,
    change_digest,
    change_row_count,
    null_closed_by,
    add_dead_letter,
    remove_dead_letter,
    remove_integrity,
    add_false_integrity,
    add_false_malformed,
    add_huge_gap,
    remove_marker,
)
#: And the other columns docs/loadtest.md says are checked: the long form applies these too.
FULL_KINDS: tuple[Generator, ...] = (
    *FAST_KINDS,
    change_event_ms,
    change_topic,
    change_expected_digest,
    change_dead_letter_value,
)


def full_corruptions(
    run: FullRun, many: int, seed: int = 7, kinds: Iterable[Generator] = FULL_KINDS
) -> list[Corruption]:
    """Up to ``many`` corruptions of each kind (and of each variant) of a full-contract output."""
    out = []
    for make in kinds:
        out += make(run, random.Random(f"{seed}-{make.__name__}"), many)
    return out


# ------------------------------------------------------------------------------------ the tables contract


Edit = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def _table_edit(rel: str, edit: Edit) -> Callable[[Path], None]:
    return lambda root: rewrite(root, rel, edit)


def _without(i: int) -> Edit:
    return lambda rows: rows[:i] + rows[i + 1 :]


def _twice(i: int) -> Edit:
    return lambda rows: [*rows, dict(rows[i])]


def _with(added: dict[str, Any]) -> Edit:
    return lambda rows: [*rows, added]


def _changed(i: int, edit: Callable[[dict[str, Any]], None]) -> Edit:
    return lambda rows: [*rows[:i], _edited(rows[i], edit), *rows[i + 1 :]]


def _tables_rule(run: TablesRun, row: Row) -> str | None:
    if str(row.values.get("session")) in run.not_judged:
        return "docs/own-pipeline.md: a session with a copy of unknown delivery is not judged"
    return None


def tables_corruptions(run: TablesRun, many: int, seed: int = 7) -> list[Corruption]:
    """Up to ``many`` corruptions of each kind of a final table, and the exact-decimal one that is none."""
    rng = random.Random(seed)
    rows = run.rows
    out = []
    for row in _spread(rng, rows, many, _session_key):
        out.append(
            Corruption(
                "drop a row",
                run.name,
                row.named(),
                "removed",
                _table_edit(row.file, _without(row.index)),
                _tables_rule(run, row),
            )
        )
    for row in _spread(rng, rows, many, _session_key):
        out.append(
            Corruption(
                "duplicate a row",
                run.name,
                row.named(),
                "written twice",
                _table_edit(row.file, _twice(row.index)),
                _tables_rule(run, row),
            )
        )
    numeric = [r for r in rows if isinstance(r.values.get("value"), float)]
    for n, row in enumerate(_spread(rng, numeric, many, _session_key)):
        if n % 2 == 0:
            new = float(row.values["value"]) + 1.25
            change, edit = f"value {row.values['value']} -> {new}", _set(value=new)
        else:
            text = next(
                k for k, v in row.values.items() if isinstance(v, str) and k not in ("session", "sensor")
            )
            change, edit = (
                f"{text} {row.values[text]!r} -> {row.values[text] + '-x'!r}",
                _set(**{text: row.values[text] + "-x"}),
            )
        out.append(
            Corruption(
                "change a value",
                run.name,
                row.named(),
                change,
                _table_edit(row.file, _changed(row.index, edit)),
                _tables_rule(run, row),
            )
        )
    for row in _spread(rng, rows, many, _session_key):
        ids = {r.values["row_id"] for r in rows if r.values["session"] == row.values["session"]}
        new_id = max(ids) + 1000
        added = (
            {**row.values, "row_id": new_id, "id": new_id}
            if "id" in row.values
            else {**row.values, "row_id": new_id}
        )
        out.append(
            Corruption(
                "add a row",
                run.name,
                row.named(),
                f"a copy of it as row {new_id}, which no message touched",
                _table_edit(row.file, _with(added)),
                _tables_rule(run, row),
            )
        )
    for row in _spread(rng, rows, many, _session_key):
        session = str(row.values["session"])
        mine = run.sessions.get(session)
        others = sorted(
            s
            for s, f in run.sessions.items()
            if s != session and mine is not None and f.sensor == mine.sensor
        )
        if not others:
            continue
        other = rng.choice(others)
        allowed = _tables_rule(run, row) or (
            "docs/own-pipeline.md: a session with a copy of unknown delivery is not judged"
            if other in run.not_judged
            else None
        )
        out.append(
            Corruption(
                "move a row to another session",
                run.name,
                row.named(),
                f"session -> {other}",
                _table_edit(row.file, _changed(row.index, _set(session=other))),
                allowed,
            )
        )
    files = sorted({r.file for r in rows})
    for rel in files[:1]:
        out.append(
            Corruption(
                "write a float as an exact decimal (no corruption)",
                run.name,
                f"{rel}: column value",
                "float64 -> decimal, each the float's exact value (decimal.Decimal(x))",
                _decimals_in(rel, "value"),
                expect_pass=True,
            )
        )
    return out


def _edited(row: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    new = dict(row)
    edit(new)
    return new


def _decimals_in(rel: str, column: str) -> Callable[[Path], None]:
    return lambda root: exact_decimals(root / rel, column)


def exact_decimals(path: Path, column: str) -> None:
    """Rewrite ``column`` of a Parquet file as a decimal holding each float's exact binary value."""
    table = pq.read_table(path, partitioning=None)
    floats = table[column].to_pylist()
    exact = [None if x is None else Decimal(x) for x in floats]
    shapes = [d.as_tuple() for d in exact if d is not None]
    scale = max((-int(t.exponent) for t in shapes), default=0)
    whole_digits = max((len(t.digits) + int(t.exponent) for t in shapes), default=1)
    precision = max(1, whole_digits) + scale
    kind = pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    i = table.schema.get_field_index(column)
    table = table.set_column(i, pa.field(column, kind), pa.array(exact, kind))
    tmp = path.with_name(f".{path.name}.corrupting")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Verdict:
    """What the verifier said of one output: PASS/FAIL with its counts, or that it did not answer."""

    passed: bool | None
    seconds: float
    summary: str
    kinds: tuple[str, ...] = ()
    #: Every discrepancy, as ``kind|session|seq|detail``: what a corruption adds to an output's own.
    found: frozenset[str] = frozenset()

    @property
    def answered(self) -> bool:
        return self.passed is not None

    def timed(self, seconds: float) -> Verdict:
        return replace(self, seconds=seconds)


def stop_arguments(stopped: bool, error: str = "", to: Callable[..., Any] = verify_run) -> dict[str, Any]:
    """How ``verify_run`` (or ``verify``) is told how the job ended, in whichever form it takes today.

    ``stopped``: the job stopped on its own (``strict`` at its first violation, with ``error`` its message);
    otherwise it ran until it had read everything and was stopped from outside.
    """
    params = inspect.signature(to).parameters
    if "job_exit" in params:
        from loadtest.correctness.stops import JobExit

        return {"job_exit": JobExit(on_its_own=stopped, code=1 if stopped else None, last_error=error)}
    if "pipeline_stopped" in params:
        return {"pipeline_stopped": stopped}
    raise AssertionError(
        f"{to.__name__}{inspect.signature(to)} no longer says how to tell it how the job ended"
    )


def _summary(c: Any) -> Verdict:
    found = "; ".join(f"{d.kind} {d.session} seq {d.seq}: {d.detail[:160]}" for d in c.discrepancies[:3])
    counts = (
        f"sessions {c.sessions_expected}, rows written {c.rows_written}, values checked {c.rows_values_checked}, "
        f"exact {c.sessions_exact}/{c.sessions_exact_required}"
    )
    reasons = "; ".join(c.reasons[:6]) + (" ..." if len(c.reasons) > 6 else "")
    text = f"PASS ({counts})" if c.passed else f"FAIL: {reasons} ({counts}) [{found}]"
    every = frozenset(f"{d.kind}|{d.session}|{d.seq}|{d.detail}" for d in c.discrepancies)
    return Verdict(bool(c.passed), 0.0, text, tuple(sorted(c.discrepancy_counts)), every)


@dataclass(frozen=True)
class Check:
    """One verification to run: an output (root or table), how it is read, and with which verifier call."""

    run_dir: Path
    output: Path
    contract: str
    policy: Policy
    stopped: bool
    shard_rows: int
    error: str = ""
    #: The run's expectation, built once: the whole output is then verified with ``verify`` alone, which is
    #: what ``verify_run`` does after building it.
    expectation: Any = None

    def __call__(self) -> Verdict:
        if self.contract == "full" and self.shard_rows == WHOLE and self.expectation is not None:
            from loadtest.correctness.output import read_output
            from loadtest.correctness.verify import verify

            stop = stop_arguments(self.stopped, self.error, verify)
            return _summary(verify(self.expectation, read_output(self.output, "parquet"), None, **stop))
        spec = OutputSpec(self.output, self.contract, "parquet")
        stop = stop_arguments(self.stopped, self.error)
        c = verify_run(self.run_dir, spec, self.policy, None, shard_rows=self.shard_rows, **stop)
        return _summary(c)


def _limit_memory(more: int) -> None:
    """Let this process grow by ``more`` bytes of address space at most, so a runaway verifier fails alone."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as status:
            size = int(next(line for line in status if line.startswith("VmSize")).split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + more, size + more))


def _worker(tasks: Sequence[Callable[[], Verdict]], conn: Connection, memory: int) -> None:
    """A forked verifier: runs the tasks the parent names, one at a time, and answers each with its verdict."""
    _limit_memory(memory)
    while (i := conn.recv()) is not None:
        started = time.monotonic()
        try:
            verdict = tasks[i]().timed(time.monotonic() - started)
        except BaseException as exc:  # noqa: BLE001 -- any failure of the verifier is its answer here
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            verdict = Verdict(None, time.monotonic() - started, f"raised {last[:300]}")
        conn.send((i, verdict))
    conn.close()


@dataclass
class _Busy:
    proc: Any
    task: int
    started: float


def free_cores() -> int:
    """How many verifications to run at once: a second worker only while the machine has a core to spare."""
    cores = len(os.sched_getaffinity(0))
    return max(1, min(cores, int(cores - os.getloadavg()[0] + 0.5)))


def run_guarded(
    tasks: Sequence[Callable[[], Verdict]],
    jobs: int | None = None,
    timeout_s: float = 20.0,
    memory: int = 2 << 30,
) -> list[Verdict]:
    """Each task's verdict, given in forked workers that may each grow by ``memory`` bytes at most.

    ``jobs`` workers take the tasks one at a time (a worker keeps what the verifier loaded for the next one);
    a task that does not answer within ``timeout_s`` is reported as hung and its worker killed and replaced.
    """
    ctx = multiprocessing.get_context("fork")
    jobs = jobs or free_cores()
    results: list[Verdict | None] = [None] * len(tasks)
    queue = list(range(len(tasks)))
    busy: dict[Connection, _Busy] = {}
    while queue or busy:
        while queue and len(busy) < jobs:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(tasks, child, memory), daemon=True)
            proc.start()
            child.close()
            parent.send(queue[0])
            busy[parent] = _Busy(proc, queue.pop(0), time.monotonic())
        deadline = min(b.started for b in busy.values()) + timeout_s
        ready = wait(list(busy), timeout=max(0.0, deadline - time.monotonic()))
        for conn in [c for c in busy if c in ready]:
            b = busy[conn]
            try:
                i, verdict = conn.recv()
                results[i] = verdict
            except EOFError:
                results[b.task] = Verdict(None, time.monotonic() - b.started, f"died ({b.proc.exitcode})")
                del busy[conn]
                b.proc.join(5)
                continue
            if queue:
                b.task, b.started = queue.pop(0), time.monotonic()
                conn.send(b.task)
            else:
                conn.send(None)
                del busy[conn]
                b.proc.join(5)
        now = time.monotonic()
        for conn, b in list(busy.items()):
            if now - b.started >= timeout_s:
                b.proc.kill()
                b.proc.join(5)
                del busy[conn]
                results[b.task] = Verdict(
                    None, now - b.started, f"hung: no verdict within {timeout_s:g} s (killed)"
                )
    return [r if r is not None else Verdict(None, 0.0, "no result") for r in results]


# ---------------------------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Outcome:
    """A corruption and the verifier's verdicts on it: whole, and a few sensors at a time (None: not asked).

    ``baseline`` is the outcome of the untouched output: when it FAILs, a corruption counts as caught only
    if its verdict names a discrepancy the untouched output's does not.
    """

    corruption: Corruption
    whole: Verdict | None
    sharded: Verdict | None
    baseline: Outcome | None = None

    @property
    def skipped(self) -> bool:
        return self.corruption.allowed is not None

    def verdicts(self) -> list[tuple[str, Verdict]]:
        return [(name, v) for name, v in (("whole", self.whole), ("sharded", self.sharded)) if v is not None]

    def misses(self) -> list[tuple[str, Verdict, str]]:
        """The verdicts that are not what the corruption requires, each with why.

        A corruption that is wrong must FAIL for something it did; one that is no corruption must PASS.
        """
        if self.skipped:
            return []
        out = []
        for mode, v in self.verdicts():
            if self.corruption.expect_pass:
                if v.passed is not True:
                    out.append((mode, v, ""))
                continue
            if v.passed is not False:
                out.append((mode, v, ""))
                continue
            if self.corruption.deadline_s is not None and v.seconds > self.corruption.deadline_s:
                out.append((mode, v, f"FAILs, but only after {v.seconds:.1f} s: "))
                continue
            before = getattr(self.baseline, mode, None) if self.baseline is not None else None
            if before is not None and before.passed is False and not v.found - before.found:
                out.append((mode, v, "FAILs only for what the untouched output FAILs for: "))
        return out

    def caught(self, mode: str) -> bool | None:
        """Whether the verdict of ``mode`` is the one required (None: not asked)."""
        v = getattr(self, mode)
        if v is None:
            return None
        return not any(m == mode for m, _, _ in self.misses())


def verify_corruptions(
    corruptions: Sequence[Corruption],
    run: FullRun | TablesRun,
    scratch: Path,
    sharded: Callable[[Corruption], bool] = lambda c: True,
    baseline: Outcome | None = None,
    jobs: int | None = None,
    timeout_s: float = 20.0,
) -> list[Outcome]:
    """Apply each corruption to a fresh copy of the run's output and get the verifier's verdicts.

    Each is verified whole and, when ``sharded`` says so, a few sensors at a time. Corruptions a rule allows
    are not verified.
    """
    tasks: list[Callable[[], Verdict]] = []
    slots: list[tuple[int, str]] = []
    for n, c in enumerate(corruptions):
        if c.allowed is not None:
            continue
        root = copy_output(run.output, scratch / f"c{n:04d}")
        c.apply(root)
        tasks.append(run.check(root, WHOLE))
        slots.append((n, "whole"))
        if sharded(c):
            tasks.append(run.check(root, SHARDED))
            slots.append((n, "sharded"))
    verdicts = run_guarded(tasks, jobs=jobs, timeout_s=timeout_s)
    found: dict[int, dict[str, Verdict]] = defaultdict(dict)
    for (n, mode), v in zip(slots, verdicts, strict=True):
        found[n][mode] = v
    return [
        Outcome(c, found[n].get("whole"), found[n].get("sharded"), baseline)
        for n, c in enumerate(corruptions)
    ]


def report(outcomes: Sequence[Outcome], runs: Sequence[str]) -> str:
    """A table of corruption kinds x runs (caught/wrong, whole and sharded; allowed), then every miss and skip."""
    kinds = list(dict.fromkeys(o.corruption.kind for o in outcomes))
    cells: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        cells[(o.corruption.kind, o.corruption.run)].append(o)

    def cell(items: list[Outcome]) -> str:
        if not items:
            return "-"
        judged = [o for o in items if not o.skipped]
        parts = []
        for mode in ("whole", "sharded"):
            asked = [o for o in judged if getattr(o, mode) is not None]
            if asked:
                good = sum(1 for o in asked if o.caught(mode))
                parts.append(f"{mode[0]} {good}/{len(asked)}")
        skipped = len(items) - len(judged)
        if skipped:
            parts.append(f"{skipped} allowed")
        return " ".join(parts)

    width = max(len(k) for k in kinds) if kinds else 10
    columns = [max(len(r), 18) for r in runs]
    lines = [
        "corruptions caught (w: whole, s: sharded; caught/wrong, or passed/total for no corruption; allowed: "
        "skipped; when the untouched output FAILs, a corruption is caught only by a discrepancy of its own)",
        " | ".join([f"{'kind':<{width}}", *(f"{r:<{w}}" for r, w in zip(runs, columns, strict=True))]),
        "-+-".join(["-" * width, *("-" * w for w in columns)]),
    ]
    for kind in kinds:
        row = [f"{kind:<{width}}"]
        row += [f"{cell(cells[(kind, r)]):<{w}}" for r, w in zip(runs, columns, strict=True)]
        lines.append(" | ".join(row))
    wrong = [o for o in outcomes if not o.skipped]
    misses = [o for o in wrong if o.misses()]
    verdicts = sum(len(o.verdicts()) for o in wrong)
    missed = sum(len(o.misses()) for o in wrong)
    share = 100 * (len(wrong) - len(misses)) / len(wrong) if wrong else 100.0
    lines.append(
        f"judged right in every form: {len(wrong) - len(misses)}/{len(wrong)} ({share:.0f} %); verdicts "
        f"{verdicts - missed}/{verdicts}; {len(outcomes) - len(wrong)} allowed by a rule and not verified"
    )
    if misses:
        lines.append("\nnot caught:")
        for o in misses:
            for mode, v, why in o.misses():
                lines.append(f"- {o.corruption.named()} -- {mode}: {why}{v.summary} [{v.seconds:.1f} s]")
    skipped = [o for o in outcomes if o.skipped]
    if skipped:
        lines.append("\nallowed (not verified):")
        for o in skipped:
            lines.append(f"- {o.corruption.named()} -- {o.corruption.allowed}")
    return "\n".join(lines)


def untouched(run: FullRun | TablesRun, sharded: bool = True) -> Outcome:
    """The verdicts on the output as the job wrote it, which must PASS (whole, and sharded when asked).

    Given here, in this process: the verifier's first call pays for what it loads and compiles once, and every
    forked verification of a corruption after it starts from what this one loaded.
    """
    none = Corruption(
        "untouched output (must PASS)",
        run.name,
        str(run.output),
        "nothing",
        lambda root: None,
        expect_pass=True,
    )
    verdicts = []
    for mode in [WHOLE, SHARDED] if sharded else [WHOLE]:
        started = time.monotonic()
        verdicts.append(run.check(run.output, mode)().timed(time.monotonic() - started))
    return Outcome(none, verdicts[0], verdicts[1] if sharded else None)


__all__ = [
    "FAST_KINDS",
    "FULL_KINDS",
    "Check",
    "Corruption",
    "FullRun",
    "Outcome",
    "TablesRun",
    "Verdict",
    "full_corruptions",
    "report",
    "run_guarded",
    "tables_corruptions",
    "untouched",
    "verify_corruptions",
]
