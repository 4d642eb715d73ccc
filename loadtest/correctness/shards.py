"""A long run verified a few sensors at a time: which sensors go together, and one verdict from theirs.

A long run's ledger and output do not fit in memory at once (about 2 KB a message with the checks' own
frames). Sensors are independent: each has its own topic, its sessions never span two sensors, and the
output is partitioned by sensor, so a shard of sensors can be read and checked alone
(``loadtest.correctness.verify.verify_run``) and the shards' verdicts added up here (``merge``) into the
verdict the whole run would get.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypedDict

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from loadtest.correctness.expect import is_in, parquet_dataset, simulator_dirs
from loadtest.correctness.output import PipelineOutput
from loadtest.correctness.tally import ratio
from loadtest.reports.results import Correctness, Discrepancy, FaultScore

#: Ledger rows verified at once by default: about 5 GB at the verifier's ~2 KB a message.
SHARD_ROWS = 2_500_000

#: The ``Correctness`` counts a run's shards add up to.
COUNTS = (
    "sessions_expected",
    "sessions_exact_required",
    "sessions_exact",
    "rows_expected",
    "rows_written",
    "rows_lost",
    "rows_repeated",
    "rows_unexpected",
    "rows_wrong",
    "rows_values_checked",
    "malformed_sent",
    "malformed_quarantined",
    "sessions_judged",
)


@dataclass(frozen=True)
class Shard:
    """Sensors verified together: their names, their topics, and where they stand among the run's sensors.

    ``first`` and ``last`` count the run's sensors from 1 in name order, for progress messages.
    """

    sensors: tuple[str, ...]
    topics: tuple[str, ...]
    rows: int
    first: int
    last: int
    #: The sessions of those sensors, from the ledger.
    sessions: frozenset[str] = frozenset()

    def named(self) -> str:
        """``sensor 3`` or ``sensors 3-5``."""
        return f"sensor {self.first}" if self.first == self.last else f"sensors {self.first}-{self.last}"

    def where(self) -> dict[str, ds.Expression]:
        """The filter of each output dataset (``read_output``) that keeps this shard's rows.

        A row is this shard's when it is filed under one of its sensors and names one of that sensor's
        sessions; a row filed under the wrong sensor, or naming no session the ledger has there, is found
        by ``outside`` and goes to its own session's shard, or to none.
        """
        mine = is_in("sensor", self.sensors) & is_in("session", self.sessions)
        return {
            "changes": mine,
            "sessions": mine,
            "integrity": mine,
            "dead_letters": is_in("topic", self.topics),
        }

    def misfiled(self) -> ds.Expression:
        """Rows filed under this shard's sensors that name no session of theirs (or none)."""
        return is_in("sensor", self.sensors) & (
            ~is_in("session", self.sessions) | ds.field("session").is_null()
        )


def outside(shards: Sequence[Shard]) -> dict[str, ds.Expression]:
    """The filter of each output dataset that keeps the rows of no shard.

    Those filed under no sensor of the ledger (or none), and those filed under a sensor that name none of its
    sessions: another sensor's session (a row misfiled) or a session the ledger never had.
    """
    sensors = [s for shard in shards for s in shard.sensors]
    topics = [t for shard in shards for t in shard.topics]
    stray = ~is_in("sensor", sensors) | ds.field("sensor").is_null()
    for shard in shards:
        stray = stray | shard.misfiled()
    unknown_topic = ~is_in("topic", topics) | ds.field("topic").is_null()
    return {"changes": stray, "sessions": stray, "integrity": stray, "dead_letters": unknown_topic}


def of_sessions(output: PipelineOutput, sessions: Collection[str], *, others: bool = False) -> PipelineOutput:
    """The change, session and integrity rows of ``output`` in ``sessions`` (with ``others``, in none of them).

    Dead letters are named by topic, not session: they are kept only with ``others``.
    """

    def rows(frame: pd.DataFrame) -> pd.DataFrame:
        if frame.empty:
            return frame
        return frame[frame["session"].astype(str).isin(sessions) != others].reset_index(drop=True)

    dead = output.dead_letters if others else output.dead_letters.iloc[0:0]
    return replace(
        output,
        changes=rows(output.changes),
        sessions=rows(output.sessions),
        integrity=rows(output.integrity),
        dead_letters=dead,
    )


def plus(output: PipelineOutput, more: PipelineOutput) -> PipelineOutput:
    """Both outputs' rows together (the commit times are the same root's)."""

    def both(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
        return pd.concat([a, b], ignore_index=True) if not b.empty else a

    return replace(
        output,
        changes=both(output.changes, more.changes),
        sessions=both(output.sessions, more.sessions),
        integrity=both(output.integrity, more.integrity),
        dead_letters=both(output.dead_letters, more.dead_letters),
    )


def plan_shards(run_dir: Path, shard_rows: int = SHARD_ROWS) -> list[Shard]:
    """The run's sensors in shards of at most ``shard_rows`` ledger rows, or none when the run fits in one.

    The total comes from the Parquet footers; only a longer run has its ``sensor`` and ``topic`` columns
    scanned, a batch at a time. Sensors stay in name order; one with more rows than ``shard_rows`` is a shard
    of its own.
    """
    datasets = [d for d in (parquet_dataset(p / "ledger") for p in simulator_dirs(run_dir)) if d is not None]
    if sum(d.count_rows() for d in datasets) <= shard_rows:
        return []
    rows: Counter[str] = Counter()
    topics: dict[str, set[str]] = defaultdict(set)
    sessions: dict[str, set[str]] = defaultdict(set)
    for dataset in datasets:
        for batch in dataset.to_batches(columns=["sensor", "topic", "session"]):
            counted = (
                pa.Table.from_batches([batch])
                .group_by(["sensor", "topic", "session"])
                .aggregate([([], "count_all")])
            )
            columns = (counted[c].to_pylist() for c in ("sensor", "topic", "session", "count_all"))
            for sensor, topic, session, n in zip(*columns, strict=True):
                rows[sensor] += n
                topics[sensor].add(topic)
                sessions[sensor].add(session)
    groups: list[list[str]] = []
    for sensor in sorted(rows):
        if not groups or sum(rows[s] for s in groups[-1]) + rows[sensor] > shard_rows:
            groups.append([])
        groups[-1].append(sensor)
    shards, first = [], 1
    for group in groups:
        mine = sorted({t for s in group for t in topics[s]})
        shards.append(
            Shard(
                tuple(group),
                tuple(mine),
                sum(rows[s] for s in group),
                first,
                first + len(group) - 1,
                frozenset(x for s in group for x in sessions[s]),
            )
        )
        first += len(group)
    return shards


def merge(parts: Sequence[Correctness], injected: Mapping[str, int]) -> Correctness:
    """One verdict from the verdicts of a run's shards, as the whole run verified at once would have it.

    Counts and statuses add up; fault scores add up per kind and their precision and recall are computed
    again (``checks.score_faults``), with ``injected`` the whole run's count of each fault; damage and
    discrepancies are put together, and what is counted from them (``summarise``) is counted again. Only the
    order of damage windows and discrepancies differs: shard after shard.
    """
    discrepancies = [d for p in parts for d in p.discrepancies]
    counts = {name: sum(getattr(p, name) for p in parts) for name in COUNTS}
    statuses: Counter[str] = Counter()
    delivered: Counter[str] = Counter()
    for p in parts:
        statuses.update(p.statuses)
        delivered.update(p.faults_delivered)
    return replace(
        parts[0],
        **counts,
        passed=not discrepancies,
        exact_match_rate=ratio(counts["sessions_exact"], counts["sessions_exact_required"]),
        must_stop=any(p.must_stop for p in parts),
        statuses=dict(statuses),
        faults_delivered=dict(delivered),
        faults=_merge_faults([f for p in parts for f in p.faults], injected),
        damage=[w for p in parts for w in p.damage],
        discrepancies=discrepancies,
        **summarise(discrepancies),
    )


class Summary(TypedDict):
    """What ``Correctness`` counts from its discrepancies."""

    discrepancy_counts: dict[str, int]
    blame: dict[str, int]
    reasons: list[str]


def summarise(discrepancies: Sequence[Discrepancy]) -> Summary:
    """``Correctness``'s ``discrepancy_counts``, ``blame`` and ``reasons`` from its discrepancies."""
    kinds = Counter(d.kind for d in discrepancies)
    blame = Counter(d.triage.layer for d in discrepancies if d.triage is not None)
    return Summary(
        discrepancy_counts=dict(kinds),
        blame=dict(blame),
        reasons=[f"{n} {kind.replace('_', ' ')}" for kind, n in sorted(kinds.items())],
    )


def _merge_faults(scores: Iterable[FaultScore], injected: Mapping[str, int]) -> list[FaultScore]:
    by_kind: dict[tuple[str, str], list[FaultScore]] = defaultdict(list)
    for score in scores:
        by_kind[(score.kind, score.fault)].append(score)
    merged = []
    for (kind, fault), same in by_kind.items():
        expected = sum(s.expected for s in same)
        detected = sum(s.detected for s in same)
        hits = sum(s.true_positives for s in same)
        # Precision counts the reports the policy allowed, which a FaultScore keeps only as precision x detected.
        allowed = sum(round(s.precision * s.detected) for s in same if s.detected)
        merged.append(
            FaultScore(
                kind,
                fault,
                injected.get(fault, 0),
                expected,
                detected,
                hits,
                ratio(allowed, detected),
                ratio(hits, expected),
            )
        )
    # score_faults lists the violation kinds by name; check_dead_letters adds malformed after them.
    return sorted(merged, key=lambda s: (s.kind == "malformed", s.kind))
