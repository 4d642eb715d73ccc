"""What a correct pipeline must write under a policy, rebuilt from the simulator's ledger alone.

This is an independent model of the integrity policies in issue 4 (it deliberately shares no code with
``pipeline.state``): each session's delivered copies are replayed in arrival order, which is Kafka's
``(partition, offset)`` order, and the policy decides what is applied, what is dropped, which violations
must be reported and how the session must close.

Where the specification leaves a choice to the pipeline (a ``window`` hole still open when ``end`` arrives
may be flushed at once or at the timeout; a ``once`` row superseded by a higher seq may or may not emit a
change row), the model runs each reading and keeps what they agree on as *required* and the rest as
*allowed*. The policy table, per session:

=========  ===================================  ====================================  =====================
policy     applied                              violations that must be reported      status when ``end``
=========  ===================================  ====================================  =====================
strict     in seq order until the first         none required; the query must stop    ``ok``; the faulty
           violation, nothing after it          (``must_stop``)                       session absent or
                                                                                      ``failed``
ordered    seqs above the next expected;        gap (each skipped seq), duplicate,    ``degraded`` after a
           stale and repeated seqs dropped      reorder (stale seq that never came)   gap, else ``ok``
once       every distinct seq once, any order   duplicate; gap for each seq missing   ``failed`` if a seq is
                                                when the session closes               missing, else ``ok``
window     buffered and released in seq         gap when a hole outlives the window,  ``degraded`` after a
           order; a hole expires when more      duplicate, reorder (came after its    gap, else ``ok``
           than ``window_messages`` wait        hole expired)
none       everything as it comes               none required (counts only)           ``ok`` when clean,
                                                                                      else not checked
=========  ===================================  ====================================  =====================

A session with no ``end`` (abandoned, or still open when the run stopped) must close ``timed_out`` with a
``timeout`` violation once the pipeline's timeout has passed (``Policy.timeouts_expire``); ``once`` may call
it ``failed`` and ``ordered``/``window`` ``degraded`` when seqs were missing. A session's table must equal
the truth digest exactly when every snapshot and update seq it meant to send was applied in an order the
policy makes equivalent to seq order. Malformed copies are matched to dead letters by offset (their seq is
unknown to the pipeline), and the seq they replaced is missing like a gap.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from loadtest.correctness.policies import SESSION_LEVEL, Arrival, Event, Outcome, Policy
from loadtest.errors import HarnessError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionExpectation:
    """What the pipeline must write for one session (see the module docstring for the rules)."""

    session: str
    sensor: str
    topic: str
    truth_status: str
    truth_digest: str | None
    statuses: frozenset[str]
    closed_by: frozenset[str]
    exact: bool
    degraded_from: frozenset[int]
    applied_min: dict[int, int]
    applied_max: dict[int, int]
    events_required: frozenset[Event]
    events_allowed: frozenset[Event]
    update_seqs: tuple[int, ...]
    stop_at: int | None = None
    #: A strict stop may have cut the session short: its output may hold only a prefix of its changes.
    cut_short: bool = False
    #: Seqs delivered after their partition's offsets started again lower: the broker had lost data by then.
    after_reset: frozenset[int] = frozenset()

    @property
    def must_be_present(self) -> bool:
        """Whether a session record must exist."""
        return "absent" not in self.statuses


@dataclass(frozen=True)
class Expectation:
    """The whole run's expectation: per session, plus dead letters and the ledger for triage."""

    policy: Policy
    sessions: dict[str, tuple[SessionExpectation, ...]]
    malformed: pd.DataFrame
    undelivered: pd.DataFrame
    ledger: pd.DataFrame
    injected: dict[str, int]
    must_stop: bool
    #: The rows each snapshot carried (``loadtest.correctness.values.read_snapshots``); empty when the run has none.
    snapshots: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: Acknowledged copies the broker gave away (``overwritten``), with ``restart``: where their offsets began again.
    overwritten: pd.DataFrame = field(default_factory=pd.DataFrame)


# --------------------------------------------------------------------------------------------------- reading


def parquet_dataset(path: Path) -> ds.Dataset | None:
    """A directory of Parquet files (or one file) as one pyarrow dataset; None if there is none."""
    if not path.exists():
        return None
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.parquet") if p.is_file())
    return ds.dataset([str(f) for f in files], format="parquet") if files else None


def read_parquet_dir(
    path: Path, where: ds.Expression | None = None, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """Read a directory of Parquet files (or one file), only the rows ``where`` selects if given.

    ``columns`` reads only those of them the files have. An empty frame if there is no file; an empty frame with the files' columns
    if ``where`` selects nothing.
    """
    dataset = parquet_dataset(path)
    if dataset is None:
        return pd.DataFrame()
    present = None if columns is None else [c for c in columns if c in dataset.schema.names]
    frame: pd.DataFrame = dataset.to_table(filter=where, columns=present).to_pandas()
    return frame


def of_sensors(sensors: Collection[str] | None) -> ds.Expression | None:
    """The filter that keeps the rows of ``sensors`` (every row when None), for ``read_parquet_dir``."""
    return None if sensors is None else is_in("sensor", sensors)


def is_in(column: str, values: Collection[str]) -> ds.Expression:
    """``column`` is one of ``values``, strings (typed, so that no values is not a null-typed set)."""
    return ds.field(column).isin(pa.array(sorted(values), pa.string()))


#: Where a run that several simulators wrote keeps each one's run directory: ``<run_dir>/parts/<name>``.
PARTS = "parts"


def simulator_dirs(run_dir: Path) -> list[Path]:
    """The simulator run directories of a run: ``run_dir`` itself, or each of its ``parts/<name>``.

    A Locust run's processes each run a simulator of their own over sensors of their own; the run is the
    union of their ledgers and truths.
    """
    parts = run_dir / PARTS
    if (run_dir / "ledger").exists() or not parts.is_dir():
        return [run_dir]
    return sorted(p for p in parts.iterdir() if p.is_dir())


def _union(frames: list[pd.DataFrame]) -> pd.DataFrame:
    kept = [f for f in frames if not f.empty]
    if not kept:  # keep the columns of an empty read, which a filter that selects nothing gives
        return next((f for f in frames if len(f.columns)), pd.DataFrame())
    return pd.concat(kept, ignore_index=True) if len(kept) > 1 else kept[0]


def read_ledger(
    run_dir: Path, sensors: Collection[str] | None = None, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """The simulator's ledger of a run directory (the union of its parts'), every copy one row.

    ``sensors`` reads only their rows (``loadtest.correctness.shards`` verifies a long run a few sensors at a
    time); none of them is not an error. ``columns`` reads only those (a long run's latencies need six of
    sixteen, and not the per-message digests that take most of the memory).

    Raises
    ------
    HarnessError
        If the run directory has no ledger.
    """
    where = of_sensors(sensors)
    ledger = _union([read_parquet_dir(d / "ledger", where, columns) for d in simulator_dirs(run_dir)])
    if ledger.empty and sensors is None:
        raise HarnessError(f"no ledger in {run_dir / 'ledger'}: was the simulator run with this run dir?")
    return ledger


def read_truth(run_dir: Path, sensors: Collection[str] | None = None) -> pd.DataFrame:
    """The simulator's truth (the union of its parts'): one row per session with its status, rows and digest.

    ``sensors`` reads only their sessions.
    """
    where = of_sensors(sensors)
    return _union(
        [read_parquet_dir(d / "truth" / "sessions.parquet", where) for d in simulator_dirs(run_dir)]
    )


# --------------------------------------------------------------------------------------------------- replays


# --------------------------------------------------------------------------------------------- expectations


def _replays(policy: Policy, arrivals: Sequence[Arrival], end_seq: int | None) -> list[Outcome]:
    """Every reading of the policy the specification allows, each replayed once."""
    outcomes = policy.model.readings(arrivals, end_seq)
    for out in outcomes:
        out.via_timeout |= out.closed_by is None and out.stop_at is None
    return outcomes


def _statuses(policy: Policy, out: Outcome, exact: bool) -> set[str]:
    """The session statuses this replay allows."""
    if out.stop_at is not None:
        return {"absent", "failed"}
    waits = set() if policy.timeouts_expire or not out.via_timeout else {"absent"}
    if out.closed_by == "end":
        return waits | policy.model.statuses_at_end(out, exact)
    return waits | policy.model.statuses_at_timeout(out)


def _session_events(policy: Policy, out: Outcome, exact: bool) -> tuple[set[Event], set[Event]]:
    """Required and allowed violations of one replay, including those about the whole session."""
    required, allowed = set(out.events), set(out.events) | out.optional_events
    if out.closed_by == "end" and not exact:
        allowed.add(("digest_mismatch", SESSION_LEVEL))
    if out.closed_by is None and out.stop_at is None and policy.timeouts_expire:
        required.add(("timeout", SESSION_LEVEL))
    if not policy.timeouts_expire:
        required -= out.at_timeout  # the timeout has not fired yet, so these may not be reported yet
    if out.via_timeout:
        allowed.add(("timeout", SESSION_LEVEL))
    if not policy.model.requires_reports:
        required = set()
    return required, allowed | required


def partition_lives(ledger: pd.DataFrame) -> pd.Series:
    """Each delivered copy's ``life`` in its partition: how many times its offsets had started again lower.

    A partition's offsets start again from a lower number when the broker lost what it had acknowledged (its
    data wiped, a topic recreated, an out-of-sync replica elected leader): what was acknowledged after such
    a reset comes after everything before it, although its offsets are lower. Acknowledgements of one
    partition arrive in offset order, so in acknowledgement order an offset below one already seen marks the
    reset. Counted over every session's copies of the partition, so a session that began after the reset is
    in the later life too. NaN for copies without an offset.
    """
    copies = ledger[ledger["delivered"].fillna(False).astype(bool) & ledger["offset"].notna()]
    if copies.empty:
        return pd.Series(index=ledger.index, dtype="float64")
    order = (
        ["topic", "partition", "acked_ts", "offset"]
        if "acked_ts" in copies
        else ["topic", "partition", "offset"]
    )
    acked = copies.sort_values(order)
    keys = [acked["topic"], acked["partition"]]
    # Each step down starts a life; a running maximum would count every copy after the first step as one.
    previous = acked.groupby(keys)["offset"].shift()
    life = (acked["offset"] < previous).astype(int).groupby(keys).cumsum()
    return life.reindex(ledger.index).astype("float64")


def overwritten(ledger: pd.DataFrame, lives: pd.Series) -> pd.DataFrame:
    """Acknowledged copies the broker no longer has: at or above an offset its partition later started again at.

    When a partition's offsets start again lower (``partition_lives``: its data wiped, an out-of-sync
    replica elected leader), the records acknowledged before at the offsets it numbers anew are gone from the
    broker, whether or not a consumer read them first. The frame is those copies (the ledger's columns) with
    ``restart``, the lowest offset a later life of their partition began at.
    """
    copies = ledger.assign(life=lives)[lives.notna()]
    if copies.empty or int(copies["life"].max()) == 0:
        return ledger.iloc[0:0].assign(restart=pd.Series(dtype="int64"))
    keys = ["topic", "partition"]
    starts = copies.groupby([*keys, "life"])["offset"].min().reset_index()
    later = []
    for (topic, partition), lives_of in starts.groupby(keys):
        ordered = lives_of.sort_values("life")
        # The lowest start of any later life: a copy at or above it was numbered anew.
        after = ordered["offset"][::-1].cummin()[::-1].shift(-1)
        later.append(
            pd.DataFrame({"topic": topic, "partition": partition, "life": ordered["life"], "restart": after})
        )
    bounds = pd.concat(later, ignore_index=True).dropna(subset=["restart"])
    merged = copies.reset_index().merge(bounds, on=[*keys, "life"])
    lost = merged[merged["offset"] >= merged["restart"]].set_index("index")
    return lost.drop(columns="life").assign(restart=lost["restart"].astype("int64"))


def beyond_end(ledger: pd.DataFrame, ends: Mapping[tuple[str, int], int]) -> pd.DataFrame:
    """Acknowledged copies at or past where their partition ends now: the broker no longer has them.

    After an unclean election or a wiped log, what the broker lost shows in the ledger alone only once new
    records are numbered over it (``overwritten``); a run that ends first (a strict pipeline stops at once,
    and the load with it) leaves the partition ending below offsets it acknowledged. The frame is those
    copies with ``restart``: where the partition ends, and ``seen`` = ``"end"``.
    """
    copies = ledger[ledger["delivered"].fillna(False).astype(bool) & ledger["offset"].notna()]
    keys = list(zip(copies["topic"], copies["partition"].astype("int64"), strict=True))
    end = pd.Series([ends.get(k, -1) for k in keys], index=copies.index, dtype="int64")
    lost = copies[(end >= 0) & (copies["offset"] >= end)]
    return lost.assign(restart=end[lost.index], seen="end")


def with_partition_ends(exp: Expectation, ends: Mapping[tuple[str, int], int]) -> Expectation:
    """``exp`` with the copies ``beyond_end`` finds added to what the broker gave away."""
    from dataclasses import replace

    found = beyond_end(exp.ledger, ends)
    known = exp.overwritten
    found = found[~found.index.isin(known.index)] if not known.empty else found
    if found.empty:
        return exp
    return replace(exp, overwritten=pd.concat([known, found]) if not known.empty else found)


def reissued(ledger: pd.DataFrame, lives: pd.Series) -> pd.Series:
    """Whether each copy was acknowledged at an offset its partition had given out before, in an earlier life.

    After an unclean election the new leader numbers new records over offsets the old one had acknowledged;
    a reader already past them never sees the new records there, through no fault of its own.
    """
    copies = ledger.assign(life=lives)[lives.notna()]
    out = pd.Series(False, index=ledger.index)
    if copies.empty or int(copies["life"].max()) == 0:
        return out
    keys = ["topic", "partition"]
    highest = copies.groupby([*keys, "life"])["offset"].max().reset_index()
    # The highest offset of any earlier life of the partition.
    highest["before"] = highest.groupby(keys)["offset"].cummax().groupby([highest[k] for k in keys]).shift()
    merged = copies.reset_index().merge(highest[[*keys, "life", "before"]], on=[*keys, "life"])
    hit = merged.loc[merged["offset"] <= merged["before"], "index"]
    out.loc[hit] = True
    return out


def _arrivals(rows: pd.DataFrame) -> tuple[list[Arrival], frozenset[int]]:
    """The session's intact delivered copies in Kafka order, and the seqs delivered after a reset.

    Kafka order is ``(partition, life, offset)``; a seq is delivered after a reset when a copy of it was
    acknowledged after its partition's offsets started again lower (``partition_lives``). ``rows`` carry
    ``life`` when the whole ledger's was counted; without it, it is counted from the session's own copies.
    """
    copies = rows[rows["delivered"].fillna(False).astype(bool) & rows["offset"].notna()]
    if "life" not in copies:
        copies = copies.assign(life=partition_lives(copies))
    intact = copies[copies["fault"] != "malformed"].sort_values(["partition", "life", "offset"])
    arrivals = [
        (int(s), str(k), int(t))
        for s, k, t in zip(intact["seq"], intact["kind"], intact["intended_ts"], strict=True)
    ]
    return arrivals, frozenset(int(s) for s in copies.loc[copies["life"] > 0, "seq"])


def expect_session(
    policy: Policy,
    rows: pd.DataFrame,
    truth: dict[str, object] | None,
) -> tuple[SessionExpectation, ...]:
    """What the pipeline may write for one session: one expectation per reading of the policy.

    The output must match one of them in full (the verifier picks the closest), so mixing parts of two
    readings (the status of one with the change rows of another) is not accepted.
    """
    first = rows.iloc[0]
    table_seqs = frozenset(int(s) for s in rows.loc[rows["kind"] != "end", "seq"].unique())
    ends = rows.loc[rows["kind"] == "end", "seq"]
    end_seq = int(ends.iloc[0]) if len(ends) else None
    arrivals, after_reset = _arrivals(rows)
    truth = truth or {}
    digest = truth.get("digest")
    updates = tuple(sorted(int(s) for s in rows.loc[rows["kind"] == "update", "seq"].unique()))
    readings = []
    for out in _replays(policy, arrivals, end_seq):
        exact = policy.model.exact(out, table_seqs)
        required, allowed = _session_events(policy, out, exact)
        seqs = set(out.applied) | out.optional_applied
        readings.append(
            SessionExpectation(
                session=str(first["session"]),
                sensor=str(first["sensor"]),
                topic=str(first["topic"]),
                truth_status=str(truth.get("status", "unknown")),
                truth_digest=str(digest) if digest is not None else None,
                statuses=frozenset(_statuses(policy, out, exact) if arrivals else {"absent"}),
                closed_by=frozenset({out.closed_by or "timeout"}),
                exact=exact and bool(arrivals) and digest is not None,
                degraded_from=frozenset({out.degraded_from} if out.degraded_from is not None else ()),
                applied_min={s: 0 if s in out.optional_applied else out.applied.get(s, 0) for s in seqs},
                applied_max={
                    s: max(1, out.applied.get(s, 0)) if s in out.optional_applied else out.applied[s]
                    for s in seqs
                },
                events_required=frozenset(required),
                events_allowed=frozenset(allowed),
                update_seqs=updates,
                stop_at=out.stop_at,
                after_reset=after_reset,
            )
        )
    return tuple(readings)


def _relax_for_stop(exp: SessionExpectation) -> SessionExpectation:
    """Under ``strict`` once the query must stop, nothing more is required, only forbidden things stay."""
    from dataclasses import replace

    return replace(
        exp,
        statuses=exp.statuses | {"absent"},
        closed_by=exp.closed_by | {"end", "timeout"} if exp.stop_at is None else exp.closed_by,
        applied_min={s: 0 for s in exp.applied_min},
        events_required=frozenset(),
        events_allowed=exp.events_allowed | {("timeout", SESSION_LEVEL)},
        cut_short=True,
    )


def relax_after_data_loss(exp: Expectation) -> Expectation:
    """The expectation for a pipeline that stopped on its own after the broker lost acknowledged data.

    A pipeline that stops on data loss (``failOnDataLoss``) stops at its first sight of it, within a trigger
    or two of the broker's return, and need never read on: what the broker acknowledged after its offsets
    started again (``SessionExpectation.after_reset``) is not required, and a session with such messages may
    be absent or hold only a prefix of its changes. Everything acknowledged before the loss stays required
    (what the broker lost with it is then the broker's, as triage finds), and nothing forbidden becomes
    allowed.
    """
    from dataclasses import replace

    def relax(want: SessionExpectation) -> SessionExpectation:
        if not want.after_reset:
            return want
        return replace(
            want,
            statuses=want.statuses | {"absent"},
            applied_min={s: 0 if s in want.after_reset else n for s, n in want.applied_min.items()},
            events_required=frozenset(),
            events_allowed=want.events_allowed | {("timeout", SESSION_LEVEL)},
            cut_short=True,
        )

    sessions = {name: tuple(relax(e) for e in readings) for name, readings in exp.sessions.items()}
    return replace(exp, sessions=sessions)


def build_expectation(
    policy: Policy,
    ledger: pd.DataFrame,
    truth: pd.DataFrame,
    snapshots: pd.DataFrame | None = None,
    stops_elsewhere: bool = False,
) -> Expectation:
    """Everything a correct pipeline must write for this ledger under ``policy``.

    ``snapshots`` are the rows each snapshot carried, against which snapshot change rows are checked.
    ``stops_elsewhere``: the ledger is some of a run's sensors, and a session of another must stop the query
    (``loadtest.correctness.verify`` verifies a long run a few sensors at a time); these sessions are then
    relaxed as a stop relaxes them, though ``must_stop`` stays their own.
    """
    lives = partition_lives(ledger)
    truth_by_session: dict[str, dict[str, object]] = {}
    for record in truth.to_dict("records") if not truth.empty else []:
        truth_by_session[str(record["session"])] = {str(k): v for k, v in record.items()}
    sessions = {
        str(name): expect_session(
            policy, rows.assign(life=lives.loc[rows.index]), truth_by_session.get(str(name))
        )
        for name, rows in ledger.groupby("session", sort=True)
    }
    must_stop = any(e.stop_at is not None for readings in sessions.values() for e in readings)
    if must_stop or stops_elsewhere:
        sessions = {name: tuple(_relax_for_stop(e) for e in readings) for name, readings in sessions.items()}
    delivered = ledger["delivered"].fillna(False).astype(bool) & ledger["offset"].notna()
    malformed = ledger[delivered & (ledger["fault"] == "malformed")]
    lost = ledger[~delivered & ~ledger["fault"].isin(["gap", "abandoned"])]
    meant = ledger[ledger["fault"] != "duplicate"]
    injected = {k: int(v) for k, v in Counter(ledger["fault"]).items() if k != "none"}
    injected["duplicate"] = int((ledger["fault"] == "duplicate").sum())
    log.info(
        "expectation under %s: %d sessions, %d meant messages, %d malformed, must_stop=%s",
        policy.name,
        len(sessions),
        len(meant),
        len(malformed),
        must_stop,
    )
    return Expectation(
        policy,
        sessions,
        malformed,
        lost,
        ledger,
        injected,
        must_stop,
        snapshots if snapshots is not None else pd.DataFrame(),
        overwritten(ledger, lives),
    )
