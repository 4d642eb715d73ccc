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
import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from loadtest.correctness.brokerloss import beyond_end, overwritten, partition_lives
from loadtest.correctness.delivery import acknowledged, kafka_positions, unknown, unknown_variants
from loadtest.correctness.policies import SESSION_LEVEL, Arrival, Event, Outcome, Policy, Strict
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
    #: The rows of the true table (what an ``end`` message carried), when the truth says.
    truth_rows: int | None = None
    #: Under ``strict``, the violations a job may name as the one that stopped it at ``stop_at``.
    stop_events: frozenset[Event] = frozenset()
    #: A session a strict stop cut short: ``applied_min`` as it was before the stop relaxed it. Its changes
    #: must be a prefix of these (every seq below the highest it wrote), and all of them once it closed.
    before_stop: dict[int, int] | None = None

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
    #: Each session's highest seq in the ledger: no violation can name a seq above it.
    top_seqs: dict[str, int] = field(default_factory=dict)
    #: Under ``strict``, a stop may have cut every session short (here or, for a shard, elsewhere in the run).
    cut_by_stop: bool = False


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


# --------------------------------------------------------------------------------------------- expectations


def _opt_int(value: object) -> int | None:
    if isinstance(value, int | float) and not (isinstance(value, float) and math.isnan(value)):
        return int(value)
    return None


def _replays(policy: Policy, arrivals: Sequence[Arrival], end_seq: int | None) -> list[Outcome]:
    """Every reading of the policy the specification allows, each replayed once."""
    outcomes = policy.model.readings(arrivals, end_seq)
    for out in outcomes:
        out.via_timeout |= out.closed_by is None and out.stop_at is None
    return outcomes


def _statuses(policy: Policy, out: Outcome, exact: bool) -> set[str]:
    """The session statuses this replay allows."""
    if out.stop_at is not None and out.closed_by == "end":
        return {"absent"} | policy.model.statuses_at_end(out, exact)  # closed before a late copy stopped it
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


def with_partition_ends(exp: Expectation, ends: Mapping[tuple[str, int], int]) -> Expectation:
    """``exp`` with the copies ``beyond_end`` finds added to what the broker gave away."""
    found = beyond_end(exp.ledger, ends)
    known = exp.overwritten
    found = found[~found.index.isin(known.index)] if not known.empty else found
    if found.empty:
        return exp
    return replace(exp, overwritten=pd.concat([known, found]) if not known.empty else found)


#: Columns ``kafka_order`` adds to the ledger's copies.
ORDER_COLUMNS = ["position", "life", "acked", "maybe"]


def kafka_order(ledger: pd.DataFrame) -> pd.DataFrame:
    """The ledger with where each sent copy sits in Kafka, computed once for all sessions.

    ``position`` (``delivery.kafka_positions``), ``life`` (``partition_lives``; a copy without an offset shares
    the life of the copy produced before it), ``acked`` (acknowledged, with an offset or without) and ``maybe``
    (of unknown outcome); NaN and False for a copy never sent.
    """
    sent = ledger[ledger["sent_ts"].notna() | acknowledged(ledger)]
    lives = partition_lives(ledger)
    order = sent.assign(position=kafka_positions(sent), life=lives.loc[sent.index])
    order = order.sort_values(["topic", "partition", "position"], kind="stable")
    order["life"] = order.groupby(["topic", "partition"])["life"].ffill().fillna(0.0)
    extra = pd.DataFrame(
        {
            "position": order["position"].reindex(ledger.index),
            "life": order["life"].reindex(ledger.index),
            "acked": ledger.index.isin(order.index[acknowledged(order)]),
            "maybe": ledger.index.isin(order.index[unknown(order)]),
        },
        index=ledger.index,
    )
    return ledger.drop(columns=[c for c in ORDER_COLUMNS if c in ledger]).join(extra)


def _arrivals(rows: pd.DataFrame, present: Collection[Any] = ()) -> tuple[list[Arrival], frozenset[int]]:
    """The session's intact copies the broker holds, in Kafka order, and the seqs delivered after a reset.

    The copies are the acknowledged ones (with an offset or without one) and, of those whose outcome is unknown
    (``loadtest.correctness.delivery``), the ones ``present`` names by ledger index. Kafka order is
    ``(partition, life, position)`` (``kafka_order``); a seq is delivered after a reset when a copy of it was
    acknowledged after its partition's offsets started again lower (``partition_lives``). ``rows`` carry
    ``kafka_order``'s columns when the whole ledger's were computed; without them, they are computed from the
    session's own copies.
    """
    if not set(ORDER_COLUMNS) <= set(rows.columns):
        rows = kafka_order(rows)
    copies = rows[rows["acked"] | (rows["maybe"] & rows.index.isin(list(present)))]
    intact = copies[copies["fault"] != "malformed"].sort_values(
        ["partition", "life", "position"], kind="stable"
    )
    arrivals = [
        (int(s), str(k), int(t))
        for s, k, t in zip(intact["seq"], intact["kind"], intact["intended_ts"], strict=True)
    ]
    return arrivals, frozenset(int(s) for s in copies.loc[copies["life"] > 0, "seq"])


class StrictReading(NamedTuple):
    """What ``strict`` makes of one session, over every reading of its copies of unknown outcome."""

    #: The seq of the copy at which it must stop the query, when every reading stops it; else None.
    stop_at: int | None
    #: Whether some reading stops it.
    may_stop: bool
    #: The seqs some reading applies before it stops (or all of them, when it does not).
    applied: frozenset[int]


def strict_reading(rows: pd.DataFrame) -> StrictReading:
    """``strict`` replayed over one session's copies in Kafka order, under each reading of its unknown copies.

    ``rows`` carry ``kafka_order``'s columns when the whole ledger's were computed (else they are computed).
    """
    if not set(ORDER_COLUMNS) <= set(rows.columns):
        rows = kafka_order(rows)
    stops: list[int | None] = []
    applied: set[int] = set()
    for present in unknown_variants(rows):
        arrivals, _ = _arrivals(rows, present)
        (out,) = Strict(Policy("strict")).readings(arrivals, None)
        stops.append(out.stop_at)
        applied |= set(out.applied)
    must = stops[0] if stops and all(stop is not None for stop in stops) else None
    return StrictReading(must, any(stop is not None for stop in stops), frozenset(applied))


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
    truth = truth or {}
    digest = truth.get("digest")
    updates = tuple(sorted(int(s) for s in rows.loc[rows["kind"] == "update", "seq"].unique()))
    readings = []
    for present in unknown_variants(rows):
        arrivals, after_reset = _arrivals(rows, present)
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
                    truth_rows=_opt_int(truth.get("rows")),
                    stop_events=frozenset(out.stop_events),
                )
            )
    return tuple(readings)


def _relax_for_stop(exp: SessionExpectation) -> SessionExpectation:
    """Under ``strict`` once the query must stop, each session may stop short: a prefix of its changes.

    Nothing more is required of a session that has not closed than a prefix (``before_stop``); forbidden
    things stay forbidden.
    """
    return replace(
        exp,
        statuses=exp.statuses | {"absent"},
        closed_by=exp.closed_by | {"end", "timeout"} if exp.stop_at is None else exp.closed_by,
        applied_min={s: 0 for s in exp.applied_min},
        before_stop=dict(exp.applied_min),
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
    ordered = kafka_order(ledger)
    sessions = {
        str(name): expect_session(policy, rows, truth_by_session.get(str(name)))
        for name, rows in ordered.groupby("session", sort=True)
    }
    # A session must stop the query when every reading of it stops (a copy of unknown outcome may spare it);
    # one that may stop it cuts every session short as a stop would.
    must_stop = any(
        readings and all(e.stop_at is not None for e in readings) for readings in sessions.values()
    )
    cut = stops_elsewhere or any(e.stop_at is not None for readings in sessions.values() for e in readings)
    if cut:
        sessions = {name: tuple(_relax_for_stop(e) for e in readings) for name, readings in sessions.items()}
    delivered = acknowledged(ledger)
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
        {str(k): int(v) for k, v in ledger.groupby("session")["seq"].max().items()},
        cut,
    )
