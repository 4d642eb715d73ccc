"""The verifier run while the load goes on: each session checked once it is closed on both sides.

``sotw run`` verifies once, at the end (``loadtest.correctness.verify.verify_run``). A game day watched in the Locust UI
wants the verdict so far: ``LiveVerifier.step`` reads what was added since its last call (the ledger files
and closed sessions the simulators wrote, with ``SimulatorConfig.record_every_s``, and the pipeline's newly
committed output files), picks the sessions that are settled (the simulator closed them long enough ago for
their late copies to be in the ledger, and the pipeline wrote their session record or had time to), verifies
just those with the same expectation and checks as the final verdict (``loadtest.correctness.expect.build_expectation``,
``loadtest.correctness.verify.verify``, triage included), adds their counts to the running totals and forgets them. Only
the current run's topics are read, so a pipeline shared by several runs is fine.

It also dates every newly committed change row (commit time minus the message's intended time), which gives
the end-to-end latency percentiles over time while the run goes on.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from loadtest.correctness.expect import build_expectation, simulator_dirs
from loadtest.correctness.output import PipelineOutput
from loadtest.correctness.policies import Policy
from loadtest.correctness.tally import FAULT_OF_VIOLATION
from loadtest.correctness.triage import Triager
from loadtest.correctness.verify import verify
from loadtest.reports.results import Correctness
from sotw.kafka import KafkaConfig

log = logging.getLogger(__name__)

#: The output datasets and their hive partition columns (docs/pipeline-outputs.md).
DATASETS = {
    "changes": ("sensor", "date"),
    "sessions": ("sensor", "date"),
    "integrity": ("sensor", "date"),
    "dead_letters": ("date",),
}
#: Width of an end-to-end latency window, ms of commit time.
WINDOW_MS = 5000
#: Windows kept for the UI (ten minutes).
WINDOWS_KEPT = 120
#: Discrepancies kept for the UI, the latest.
RECENT_KEPT = 20


@dataclass
class FaultTally:
    """One violation kind over the verified sessions, with the fault it detects."""

    fault: str
    expected: int = 0
    detected: int = 0
    true_positives: int = 0
    allowed: int = 0  # reported violations the policy allows (precision's numerator)


@dataclass
class LiveCorrectness:
    """The verdict so far: the verified sessions' counts added up (``results.Correctness``'s, summed).

    ``reported`` counts the pipeline's integrity records by violation over everything it committed so far,
    verified or not; ``faults`` is per violation kind over the verified sessions only.
    """

    sessions_closed: int = 0
    sessions_verified: int = 0
    sessions_exact_required: int = 0
    sessions_exact: int = 0
    rows_expected: int = 0
    rows_written: int = 0
    rows_lost: int = 0
    rows_repeated: int = 0
    rows_unexpected: int = 0
    malformed_sent: int = 0
    malformed_quarantined: int = 0
    discrepancy_counts: Counter[str] = field(default_factory=Counter)
    blame: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    faults: dict[str, FaultTally] = field(default_factory=dict)
    reported: Counter[str] = field(default_factory=Counter)
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_KEPT))

    @property
    def passed(self) -> bool:
        """No discrepancy in the sessions verified so far."""
        return not self.discrepancy_counts

    def add(self, result: Correctness) -> None:
        """Add one pass's verdict over newly settled sessions."""
        self.sessions_verified += result.sessions_expected
        for name in (
            "sessions_exact_required",
            "sessions_exact",
            "rows_expected",
            "rows_written",
            "rows_lost",
            "rows_repeated",
            "rows_unexpected",
            "malformed_sent",
            "malformed_quarantined",
        ):
            setattr(self, name, getattr(self, name) + getattr(result, name))
        self.discrepancy_counts.update(result.discrepancy_counts)
        self.blame.update(result.blame)
        self.statuses.update(result.statuses)
        for score in result.faults:
            tally = self.faults.setdefault(score.kind, FaultTally(score.fault))
            tally.expected += score.expected
            tally.detected += score.detected
            tally.true_positives += score.true_positives
            if score.detected:
                tally.allowed += round(score.precision * score.detected)
        for d in result.discrepancies:
            self.recent.append(
                {
                    "kind": d.kind,
                    "session": d.session,
                    "seq": d.seq,
                    "detail": d.detail,
                    "layer": d.triage.layer if d.triage else "",
                }
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the UI."""
        return {
            "passed": self.passed,
            "sessions_closed": self.sessions_closed,
            "sessions_verified": self.sessions_verified,
            "sessions_exact_required": self.sessions_exact_required,
            "sessions_exact": self.sessions_exact,
            "rows_expected": self.rows_expected,
            "rows_written": self.rows_written,
            "rows_lost": self.rows_lost,
            "rows_repeated": self.rows_repeated,
            "rows_unexpected": self.rows_unexpected,
            "malformed_sent": self.malformed_sent,
            "malformed_quarantined": self.malformed_quarantined,
            "discrepancy_counts": dict(self.discrepancy_counts),
            "blame": dict(self.blame),
            "statuses": dict(self.statuses),
            "faults": {
                k: {
                    "fault": t.fault,
                    "expected": t.expected,
                    "detected": t.detected,
                    "true_positives": t.true_positives,
                    "allowed": t.allowed,
                }
                for k, t in sorted(self.faults.items())
            },
            "reported": dict(self.reported),
            "recent": list(self.recent),
        }


def _frame(parts: list[pd.DataFrame]) -> pd.DataFrame:
    kept = [p for p in parts if not p.empty]
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame()


class OutputTail:
    """The rows a running pipeline committed since the last call, for topics starting with ``prefix``.

    Files of a batch whose ``_commits`` marker is not there yet are not visible output: they are read again
    the next time.
    """

    def __init__(self, root: Path, prefix: str) -> None:
        self.root = root
        self.prefix = prefix
        self.commits: dict[int, int] = {}
        self._read: set[Path] = set()

    def _new_commits(self) -> None:
        folder = self.root / "_commits"
        if not folder.is_dir():
            return
        for path in folder.glob("*.json"):
            try:
                batch = int(path.stem)
                if batch not in self.commits:
                    self.commits[batch] = int(json.loads(path.read_text())["committed_ms"])
            except (ValueError, KeyError, OSError):
                continue  # being renamed into place: next time

    def _files(self, name: str) -> list[Path]:
        base = self.root / name
        if not base.is_dir():
            return []
        return sorted(
            p
            for p in base.rglob("*.parquet")
            if p not in self._read and not any(s.startswith(("_", ".")) for s in p.relative_to(base).parts)
        )

    def read_new(self) -> dict[str, pd.DataFrame]:
        """New committed rows per dataset (``changes``, ``sessions``, ``integrity``, ``dead_letters``)."""
        self._new_commits()
        out: dict[str, pd.DataFrame] = {}
        for name, partitions in DATASETS.items():
            frames = []
            for path in self._files(name):
                try:
                    dataset = ds.dataset(
                        [str(path)],
                        format="parquet",
                        partitioning=ds.partitioning(
                            pa.schema([(p, pa.string()) for p in partitions]), flavor="hive"
                        ),
                        partition_base_dir=str(self.root / name),
                    )
                    frame: pd.DataFrame = dataset.to_table().to_pandas()
                except (OSError, pa.ArrowInvalid):
                    continue  # moved or half-written: next time
                if "batch_id" in frame and not frame["batch_id"].isin(list(self.commits)).all():
                    continue  # its batch is not committed yet
                self._read.add(path)
                if "topic" in frame:
                    frame = frame[frame["topic"].astype(str).str.startswith(self.prefix)]
                frames.append(frame)
            out[name] = _frame(frames)
        return out


class LedgerTail:
    """The ledger rows and closed sessions the simulators of a run wrote since the last call.

    Parameters
    ----------
    run_dir
        The run directory (a simulator's, or one with ``parts/<name>`` for several).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.horizon_ms: dict[
            Path, int
        ] = {}  # per simulator: the latest intended time in its readable ledger
        self._read: set[Path] = set()

    def _read_new(self, files: Iterable[Path]) -> list[tuple[Path, pd.DataFrame]]:
        out = []
        for path in files:
            if path in self._read:
                continue
            try:
                frame: pd.DataFrame = ds.dataset([str(path)], format="parquet").to_table().to_pandas()
            except (OSError, pa.ArrowInvalid):
                continue  # still being written
            self._read.add(path)
            out.append((path, frame))
        return out

    def read_new(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """New ledger rows, and newly closed sessions (with a ``part`` column naming their simulator)."""
        ledgers, closed = [], []
        for part in simulator_dirs(self.run_dir):
            for _, frame in self._read_new(sorted((part / "ledger").glob("part-*.parquet"))):
                if not frame.empty:
                    latest = int(frame["intended_ts"].max())
                    self.horizon_ms[part] = max(self.horizon_ms.get(part, 0), latest)
                    ledgers.append(frame)
            for _, frame in self._read_new(sorted((part / "truth" / "closed").glob("part-*.parquet"))):
                closed.append(frame.assign(part=str(part)))
        return _frame(ledgers), _frame(closed)


class LiveVerifier:
    """Verifies a running load test's sessions as they settle and keeps the verdict so far.

    Parameters
    ----------
    run_dir
        The run directory the simulators write to.
    output
        The pipeline's output root.
    prefix
        The run's topic prefix: only its topics are read.
    policy
        The policy as the verifier models it (timeouts expire: sessions are waited for).
    kafka
        The cluster, for triage; None triages from the ledger alone.
    late_ms
        How long after a session's end its late copies (delayed, duplicate) may still be sent.
    timeout_ms
        How long after a session's end the pipeline may take to write its record before it counts as missing.
    clock
        Epoch seconds.
    """

    def __init__(
        self,
        run_dir: Path,
        output: Path,
        prefix: str,
        policy: Policy,
        kafka: KafkaConfig | None = None,
        late_ms: int = 5000,
        timeout_ms: int = 60_000,
        clock: Any = time.time,
    ) -> None:
        self.policy = policy
        self.kafka = kafka
        self.late_ms = late_ms
        self.timeout_ms = timeout_ms
        self.clock = clock
        self.ledger = LedgerTail(run_dir)
        self.output = OutputTail(output, prefix)
        self.totals = LiveCorrectness()
        self.windows: dict[int, list[np.ndarray]] = {}
        self._ledger = pd.DataFrame()
        self._closed = pd.DataFrame()
        self._pending: dict[str, pd.DataFrame] = {name: pd.DataFrame() for name in DATASETS}
        self._verified: set[str] = set()

    # ------------------------------------------------------------------------------------------- reading

    def _take_new(self) -> None:
        ledger, closed = self.ledger.read_new()
        self._ledger = _frame([self._ledger, ledger])
        self._closed = _frame([self._closed, closed])
        self.totals.sessions_closed += len(closed)
        new = self.output.read_new()
        changes = new["changes"]
        if not changes.empty:
            self._date(changes)
        integrity = new["integrity"]
        if not integrity.empty:
            self.totals.reported.update(integrity["violation"].astype(str))
        for name, frame in new.items():
            self._pending[name] = _frame([self._pending[name], frame])

    def _date(self, changes: pd.DataFrame) -> None:
        """End-to-end latency of newly committed change rows, into windows of commit time."""
        committed = changes["batch_id"].map(self.output.commits).to_numpy(dtype=np.float64)
        latency = committed - changes["event_ms"].to_numpy(dtype=np.float64)
        window = (committed // WINDOW_MS).astype(np.int64) * WINDOW_MS
        for start in np.unique(window):
            self.windows.setdefault(int(start), []).append(latency[window == start])
        for old in sorted(self.windows)[:-WINDOWS_KEPT]:
            del self.windows[old]

    def latency_windows(self) -> list[dict[str, Any]]:
        """End-to-end latency (ms) per window of commit time: count, p50, p90, p99, max; oldest first."""
        rows = []
        for start in sorted(self.windows):
            values = np.concatenate(self.windows[start])
            p50, p90, p99 = np.percentile(values, (50, 90, 99))
            rows.append(
                {
                    "t_ms": start,
                    "count": int(values.size),
                    "p50": float(p50),
                    "p90": float(p90),
                    "p99": float(p99),
                    "max": float(values.max()),
                }
            )
        return rows

    # ----------------------------------------------------------------------------------------- verifying

    def _settled(self) -> list[str]:
        """Closed sessions whose late copies are in the ledger and whose record the pipeline wrote (or had time to)."""
        if self._closed.empty:
            return []
        now_ms = self.clock() * 1000.0
        records = self._pending["sessions"]
        closed = self._closed
        names = closed["session"].astype(str)
        ended = closed["ended_ms"].astype("float64").fillna(now_ms).to_numpy()
        horizon = np.array([self.ledger.horizon_ms.get(Path(str(p)), 0) for p in closed["part"]], dtype=float)
        written = names.isin(set(records["session"].astype(str)) if not records.empty else set()).to_numpy()
        late_in = horizon >= ended + self.late_ms
        given_up = now_ms > ended + self.late_ms + self.timeout_ms
        ready: list[str] = names[late_in & (written | given_up)].tolist()
        return ready

    def _subset(self, names: set[str]) -> tuple[pd.DataFrame, pd.DataFrame, PipelineOutput]:
        ledger = self._ledger[self._ledger["session"].astype(str).isin(names)]
        truth = self._closed[self._closed["session"].astype(str).isin(names)].drop(columns="part")
        frames: dict[str, pd.DataFrame] = {}
        for name in ("changes", "sessions", "integrity"):
            pending = self._pending[name]
            frames[name] = (
                pending[pending["session"].astype(str).isin(names)] if not pending.empty else pending
            )
        dead = self._pending["dead_letters"]
        if not dead.empty and not ledger.empty:
            sent = ledger[ledger["offset"].notna()]
            keys = set(
                zip(sent["topic"], sent["partition"].astype(int), sent["offset"].astype(int), strict=True)
            )
            mine = [
                (str(t), int(p), int(o)) in keys
                for t, p, o in zip(dead["topic"], dead["partition"], dead["offset"], strict=True)
            ]
            dead = dead[mine]
        output = PipelineOutput(
            changes=frames["changes"].reset_index(drop=True),
            sessions=frames["sessions"].reset_index(drop=True),
            integrity=frames["integrity"].reset_index(drop=True),
            dead_letters=dead.reset_index(drop=True),
            commits=dict(self.output.commits),
        )
        return ledger, truth, output

    def _forget(self, names: set[str]) -> None:
        self._verified |= names
        self._ledger = self._ledger[~self._ledger["session"].astype(str).isin(names)]
        self._closed = self._closed[~self._closed["session"].astype(str).isin(names)]
        for name in ("changes", "sessions", "integrity"):
            pending = self._pending[name]
            if not pending.empty:
                self._pending[name] = pending[~pending["session"].astype(str).isin(names)]

    def step(self) -> LiveCorrectness:
        """Read what is new, verify the sessions that settled, and return the verdict so far."""
        self._take_new()
        ready = set(self._settled())
        if ready:
            ledger, truth, output = self._subset(ready)
            if not ledger.empty:
                expectation = build_expectation(self.policy, ledger, truth)
                with Triager(ledger, self.kafka) as triager:
                    # A strict stop is judged over the whole run, at its end.
                    self.totals.add(verify(expectation, output, triager, judge_the_stop=False))
            self._forget(ready)
        return self.totals


def fault_rows(live: dict[str, Any], injected: dict[str, int]) -> list[dict[str, Any]]:
    """Injected faults against what the pipeline reported and what the verifier scored, one row per fault.

    ``live`` is ``LiveCorrectness.to_dict()``; ``injected`` the simulators' counters by fault kind.
    """
    reported: Counter[str] = Counter()
    for violation, n in (live.get("reported") or {}).items():
        reported[FAULT_OF_VIOLATION.get(violation, violation)] += int(n)
    scored: dict[str, dict[str, int]] = {}
    for tally in (live.get("faults") or {}).values():
        row = scored.setdefault(tally["fault"], {"expected": 0, "detected": 0, "true_positives": 0})
        for key in row:
            row[key] += int(tally[key])
    kinds = sorted(set(injected) | set(reported) | set(scored) - {"-"})
    return [
        {
            "fault": kind,
            "injected": int(injected.get(kind, 0)),
            "reported": reported.get(kind, 0),
            **scored.get(kind, {"expected": 0, "detected": 0, "true_positives": 0}),
        }
        for kind in kinds
    ]
